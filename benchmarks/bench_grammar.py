"""Grammar libraries on the CPU: llguidance against xgrammar, with SmolLM2's tokenizer.

For each of the 20 JSON schemas of ``tests/unit/data/json_schemas.json`` it measures the
compile time (a fresh compile: tokenizer-dependent preparation included, no cache) and the
time to fill one token bitmask at every step of generating the schema's example instance.
This is what picked the engine's library (``infer.engine.structured.grammar``).

    python benchmarks/bench_grammar.py            # needs: pip install xgrammar
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infer.loader import resolve_model
from infer.tokenizer import Tokenizer

SCHEMAS = Path(__file__).resolve().parents[1] / "tests" / "unit" / "data" / "json_schemas.json"
SEPARATORS = (", ", ": ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeat", type=int, default=3, help="compiles per schema (best kept)")
    args = parser.parse_args()
    source = resolve_model(args.model)
    assert source.tokenizer_path is not None
    tokenizer = Tokenizer.load(Path(source.tokenizer_path))
    assert tokenizer is not None
    cases = json.loads(SCHEMAS.read_text())
    for name, bench in (("llguidance", _llguidance), ("xgrammar", _xgrammar)):
        compile_ms, mask_us = bench(tokenizer, cases, args.repeat)
        # The first mask of a grammar finishes what a lazy compiler (llguidance) left to it.
        first_ms = [c + m / 1e3 for c, m in zip(compile_ms, mask_us[: len(cases)])]
        later = mask_us[len(cases) :]
        print(
            f"{name:>10}: compile mean {statistics.mean(compile_ms):7.2f} ms "
            f"(max {max(compile_ms):7.2f}), +first mask {statistics.mean(first_ms):7.2f} ms "
            f"(max {max(first_ms):7.2f}) | later masks mean {statistics.mean(later):6.1f} us "
            f"(p50 {statistics.median(later):6.1f}, max {max(later):7.1f}, {len(later)} steps)"
        )


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def _path(tokenizer: Tokenizer, example: Any) -> list[int]:
    text = json.dumps(example, separators=SEPARATORS)
    return tokenizer.hf.encode(text, add_special_tokens=False)


def _llguidance(
    tokenizer: Tokenizer, cases: list[dict[str, Any]], repeat: int
) -> tuple[list[float], list[float]]:
    import llguidance
    import llguidance.hf
    import llguidance.torch

    vocab = len(tokenizer.hf)
    lltok = llguidance.hf.from_tokenizer(tokenizer.hf, n_vocab=vocab, eos_token=2)
    options = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    compile_ms: list[float] = []
    first_us: list[float] = []
    mask_us: list[float] = []
    bitmask = llguidance.torch.allocate_token_bitmask(1, vocab)
    for case in cases:
        best = float("inf")
        for _ in range(repeat):
            matcher, seconds = _timed(
                lambda case=case: llguidance.LLMatcher(
                    lltok,
                    llguidance.LLMatcher.grammar_from_json_schema(case["schema"], defaults=options),
                )
            )
            best = min(best, seconds)
        assert not matcher.is_error(), matcher.get_error()
        compile_ms.append(best * 1e3)
        for step, token in enumerate(_path(tokenizer, case["example"])):
            _, seconds = _timed(
                lambda m=matcher: llguidance.torch.fill_next_token_bitmask(m, bitmask)
            )
            (mask_us if step else first_us).append(seconds * 1e6)
            assert matcher.consume_token(token), (case["name"], matcher.get_error())
        assert matcher.is_accepting(), case["name"]
    return compile_ms, first_us + mask_us


def _xgrammar(
    tokenizer: Tokenizer, cases: list[dict[str, Any]], repeat: int
) -> tuple[list[float], list[float]]:
    import xgrammar as xgr

    vocab = len(tokenizer.hf)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer.hf, vocab_size=vocab, stop_token_ids=[2])
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    compile_ms: list[float] = []
    first_us: list[float] = []
    mask_us: list[float] = []
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    for case in cases:
        best = float("inf")
        for _ in range(repeat):
            compiled, seconds = _timed(
                lambda case=case: compiler.compile_json_schema(
                    json.dumps(case["schema"]), any_whitespace=False, separators=SEPARATORS
                )
            )
            best = min(best, seconds)
        compile_ms.append(best * 1e3)
        matcher = xgr.GrammarMatcher(compiled)
        for step, token in enumerate(_path(tokenizer, case["example"])):
            _, seconds = _timed(lambda m=matcher: m.fill_next_token_bitmask(bitmask))
            (mask_us if step else first_us).append(seconds * 1e6)
            assert matcher.accept_token(token), case["name"]
        assert matcher.is_terminated() or matcher.accept_token(2), case["name"]
    return compile_ms, first_us + mask_us


if __name__ == "__main__":
    main()
