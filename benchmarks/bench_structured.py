"""Structured outputs at batch scale: ``burst256`` with every request under a JSON schema
against the same requests free, in one process (issue 17).

    python benchmarks/bench_structured.py --model DIR [--output results.json] [--scoreboard]

``DIR`` is a checkpoint directory with a tokenizer (``bench_serving_vs_vllm.py --phases
prepare`` writes dummy llama-3.2-3b with SmolLM2's tokenizer); weights are dummy. The
constrained run's requests stop where their JSON ends, so both runs report output tokens
per second, and the constrained one also, per step, how long llguidance took to fill the
token masks and how long sampling waited for them (``bitmask.Bitmask``).
``--scoreboard`` writes the headline figures into ``benchmarks/results/scoreboard.json``
(``INFER_SCOREBOARD`` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from infer import LLM, SamplingParams
from infer.bench import scoreboard
from infer.contract.sampling_params import StructuredOutputsParams
from infer.engine.structured import bitmask
from infer.workloads import make_workload

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 8},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "tags", "address"],
}


class MaskTimer:
    """Records, for every step's masks, how long llguidance took to fill them and how long
    sampling then waited for them (the part of the fill the host's other work did not
    hide)."""

    def __init__(self) -> None:
        self.fill_s: list[float] = []
        self.wait_s: list[float] = []
        self._result = bitmask.Bitmask.result

    def __enter__(self) -> MaskTimer:
        timer, result = self, self._result

        def timed(bitmask: bitmask.Bitmask) -> Any:
            start = time.perf_counter()
            try:
                return result(bitmask)
            finally:
                timer.wait_s.append(time.perf_counter() - start)
                timer.fill_s.append(bitmask.fill_s)

        bitmask.Bitmask.result = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *_: object) -> None:
        bitmask.Bitmask.result = self._result  # type: ignore[method-assign]


def run(
    llm: LLM, prompts: list[list[int]], params: list[SamplingParams]
) -> tuple[dict[str, Any], list[int]]:
    """Throughput of one batch, and each request's output length."""
    start = time.perf_counter()
    results = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    lengths = [len(r.outputs[0].token_ids) for r in results]
    reasons: dict[str, int] = {}
    for r in results:
        reason = str(r.outputs[0].finish_reason)
        reasons[reason] = reasons.get(reason, 0) + 1
        if r.outputs[0].error:
            print(f"error: {r.outputs[0].error}")
    tokens = sum(lengths)
    parsed = 0
    for r in results:
        try:
            json.loads(r.outputs[0].text)
            parsed += 1
        except ValueError:
            pass
    summary: dict[str, Any] = {
        "output_tokens": tokens,
        "seconds": elapsed,
        "output_tok_s": tokens / elapsed,
        "outputs_that_parse": parsed,
        "finish_reasons": reasons,
    }
    return summary, lengths


def _stats(name: str, seconds: list[float]) -> dict[str, float]:
    if not seconds:
        return {}
    return {
        f"{name}_mean": 1000 * sum(seconds) / len(seconds),
        f"{name}_p50": 1000 * seconds[len(seconds) // 2],
        f"{name}_p99": 1000 * seconds[int(len(seconds) * 0.99)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--num-requests", type=int, help="scale burst256 (a quick check)")
    parser.add_argument("--max-tokens", type=int, help="cap each request's output")
    parser.add_argument("--trace", type=Path, help="record the measured runs' steps here")
    parser.add_argument("--scoreboard", action="store_true", help="record the headline figures")
    args = parser.parse_args()
    # No prefix cache: the free run repeats the constrained run's prompts, and would find
    # them cached (its prefill skipped) where the constrained run computed them.
    llm = LLM(args.model, load_format="dummy", use_prefix_caching=False)
    tokenizer = llm.engine.tokenizer
    assert tokenizer is not None, "--model: structured outputs need the checkpoint's tokenizer"
    # Prompts the tokenizer knows, so the grammar's vocabulary covers them.
    workload = make_workload("burst256", tokenizer.vocab_size, args.num_requests)
    prompts = [spec.prompt_token_ids for spec in workload.requests]
    limits = [
        min(spec.max_tokens, args.max_tokens or spec.max_tokens) for spec in workload.requests
    ]
    constrained = [
        SamplingParams(
            temperature=0.0,
            max_tokens=limit,
            structured_outputs=StructuredOutputsParams(json=SCHEMA),
        )
        for limit in limits
    ]
    run(llm, prompts[:8], constrained[:8])  # compile the grammar, warm the path
    if args.trace is not None:
        from step_trace import trace_engine  # beside this script

        trace_engine(llm.engine, args.trace)
    with MaskTimer() as masks:
        schema_run, lengths = run(llm, prompts, constrained)
    # The free run produces as many tokens per request as the constrained one did.
    free = [SamplingParams(temperature=0.0, max_tokens=max(n, 1), ignore_eos=True) for n in lengths]
    free_run, _ = run(llm, prompts, free)
    fills, waits = sorted(masks.fill_s), sorted(masks.wait_s)
    report = {
        "model": args.model,
        "workload": "burst256",
        "free": free_run,
        "json_schema": schema_run,
        "schema_vs_free": schema_run["output_tok_s"] / free_run["output_tok_s"],
        "mask_fill_calls": len(fills),
        **_stats("mask_fill_ms", fills),
        **_stats("mask_wait_ms", waits),
    }
    if args.scoreboard:
        model = Path(args.model).name.removeprefix("ckpt-")  # prepare's folder: ckpt-<preset>
        prefix = f"structured/{model}/burst256"
        scoreboard.update_many(
            {
                f"{prefix}/free/output_tok_s": (free_run["output_tok_s"], "tok/s"),
                f"{prefix}/json_schema/output_tok_s": (schema_run["output_tok_s"], "tok/s"),
                f"{prefix}/json_schema_vs_free": (report["schema_vs_free"], "ratio"),
                f"{prefix}/mask_fill_ms_mean": (report["mask_fill_ms_mean"], "ms"),
                f"{prefix}/mask_wait_ms_mean": (report["mask_wait_ms_mean"], "ms"),
            },
            sampling="greedy",
        )
    text = json.dumps(report, indent=2)
    if args.output is not None:
        args.output.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
