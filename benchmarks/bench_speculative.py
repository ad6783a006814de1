"""Speculative decoding on one GPU (issue 38), two parts:

* ``quoting``: real SmolLM2-135M weights, prompts whose answers quote them (code edits,
  summaries, lists, dialogue), greedy, batch 1 and batch 8: output tok/s with n-gram
  speculation and without, the same prompts in the same process, the acceptance rate, and
  whether the outputs are identical. ``--vllm`` adds vLLM with the same n-gram settings on
  the same folder (with and without speculation).
* ``verify``: dummy weights (``--dummy-model``, llama-3.2-3b): the engine's mean step time
  decoding plainly (scheduled ahead, graphs) against steps that check ``k`` = 1..8 proposals
  per row (an engine per ``k``, its proposals the row's token again, made on the device, so
  every step checks ``k``), at batch 1 and 8; from their ratio, the acceptance rate at which
  each ``k`` breaks even (a row then yields ``(1 - a^(k+1)) / (1 - a)`` tokens a step).
* ``burst``: dummy weights, the offline ``burst256`` workload (greedy) with n-gram speculation
  switched off and on, alternately (``--rounds`` of each): speculation must cost nothing
  where it cannot pay (256 rows are compute-bound).

    python benchmarks/bench_speculative.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf \
        --parts quoting,verify,burst [--vllm] [--output F.json] [--scoreboard]

The GGUF is dequantised once into an HF folder (``--folder``, bf16) that both engines
load, so they run the same weights.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from infer import LLM, SamplingParams
from infer.bench import scoreboard
from infer.bench.checkpoint import write_gguf_checkpoint
from infer.bench.offline import run_infer
from infer.contract.speculation_stats import SpeculationStats
from infer.engine.core.engine import Engine
from infer.engine.core.request import Request
from infer.kernels.verify_inputs import ProposalMode
from infer.workloads import make_workload

CODE = '''def parse_size(text):
    """Bytes in a size such as 10K, 3M or 2G."""
    units = {"K": 1024, "M": 1024**2, "G": 1024**3}
    number, unit = text[:-1], text[-1]
    if unit not in units:
        return int(text)
    return int(number) * units[unit]
'''
STORY = (
    "The lighthouse keeper climbed the stairs at dusk, lit the lamp, and wrote the weather "
    "in his log. A ship passed to the north. At midnight the fog came in, and he wound the "
    "horn until morning, when the fog lifted and the fishing boats went out again."
)
PROMPTS = [
    f"{CODE}\nThe same function with the parameter renamed from text to value:\n\n",
    f"{CODE}\nThe same function with type hints added:\n\n",
    f"{CODE}\nThe same code, unchanged, then one line explaining it:\n\n",
    f"Story: {STORY}\n\nThe story again, word for word:\n",
    f"Story: {STORY}\n\nSummary, quoting the story's own words:\n",
    "Repeat the list five times.\nList: red, orange, yellow, green, blue, indigo, violet.\n",
    "Bob: The meeting moved to Thursday at ten in room four.\n"
    "Alice: Sorry, could you repeat that?\nBob:",
    f"Document:\n{STORY}\n\nQuestion: when did the fog lift? Answer with the sentence:\n",
]
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}


Generate = Callable[[list[str]], list[list[int]]]


def _timed_runs(
    generate: Generate, batch: int, engine: Engine | None = None
) -> tuple[float, list[list[int]], SpeculationStats]:
    """Output tok/s over every prompt, ``batch`` at a time, the outputs and (for infer) what
    speculation did meanwhile; after one unmeasured pass that compiles and warms the caches
    of both engines alike."""
    generate(PROMPTS[:batch])
    before = replace(engine.scheduler.speculation) if engine else SpeculationStats()
    outputs: list[list[int]] = []
    started = time.perf_counter()
    for first in range(0, len(PROMPTS), batch):
        outputs += generate(PROMPTS[first : first + batch])
    elapsed = time.perf_counter() - started
    spec = engine.scheduler.speculation.since(before) if engine else SpeculationStats()
    return sum(len(o) for o in outputs) / elapsed, outputs, spec


def quoting(engine: str, folder: Path, max_tokens: int) -> list[dict[str, Any]]:
    """One engine on the quoting prompts, without speculation and with it."""
    rows = []
    plain: dict[int, list[list[int]]] = {}
    for speculative in (None, NGRAM):
        generate, infer_engine = _quoting_engine(engine, folder, speculative, max_tokens)
        for batch in (1, 8):
            tok_s, outputs, spec = _timed_runs(generate, batch, infer_engine)
            row: dict[str, Any] = {
                "engine": engine,
                "speculation": speculative is not None,
                "batch": batch,
                "output_tok_s": round(tok_s, 1),
            }
            if speculative is None:
                plain[batch] = outputs
            else:
                row["identical_to_plain"] = outputs == plain[batch]
                if infer_engine is not None:
                    row["speculation_stats"] = spec.as_dict()
            rows.append(row)
            print(json.dumps(row), flush=True)
        del generate, infer_engine
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def _quoting_engine(
    engine: str, folder: Path, speculative: dict[str, Any] | None, max_tokens: int
) -> tuple[Generate, Engine | None]:
    """Greedy generation by ``engine`` (infer or vllm) on the folder's weights, and infer's
    engine (for its speculation counts)."""
    if engine == "infer":
        llm = LLM(str(folder), gpu_memory_utilization=0.3, speculative_config=speculative)
        params = SamplingParams(temperature=0, max_tokens=max_tokens)

        def generate(prompts: list[str]) -> list[list[int]]:
            results = llm.generate(prompts, params, use_tqdm=False)
            return [r.outputs[0].token_ids for r in results]

        return generate, llm.engine
    from infer.bench.vllm_peer import import_vllm

    vllm = import_vllm()
    peer = vllm.LLM(model=str(folder), gpu_memory_utilization=0.3, speculative_config=speculative)
    peer_params = vllm.SamplingParams(temperature=0, max_tokens=max_tokens)

    def generate_peer(prompts: list[str]) -> list[list[int]]:
        return [list(o.outputs[0].token_ids) for o in peer.generate(prompts, peer_params)]

    return generate_peer, None


class _AlwaysOpen:
    """A gate that lets every row take ``k`` proposals (they are not meant to pay here)."""

    def __init__(self, k: int) -> None:
        self.k = k

    def limits(self, requests: list[Request], cost: float | None) -> list[int]:
        return [self.k] * len(requests)

    def record(self, request: Request, accepted: int) -> None:
        pass

    def observe(self, requests: list[Request]) -> None:
        pass

    def forget(self, request: Request) -> None:
        pass


def _mean_decode_step_s(
    engine: Engine, batch: int, steps: int, k: int = 0, prompt_len: int = 128
) -> tuple[float, float]:
    """Mean wall time of the steps after the prompts (``batch`` rows decoding; outputs
    long enough for ``steps`` steps even where all ``k`` proposals are accepted), and the
    share of them that verified proposals."""
    params = SamplingParams(temperature=0, max_tokens=steps * (k + 1), ignore_eos=True)
    generator = torch.Generator().manual_seed(0)
    for _ in range(batch):
        prompt = torch.randint(100, 30000, (prompt_len,), generator=generator).tolist()
        engine.add_request(prompt, params)
    times, verifying = [], []
    while engine.has_unfinished_requests():
        started = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - started)
        in_flight = None if engine.ahead is None else engine.ahead.in_flight
        verifying.append(in_flight is not None and in_flight.verify_queries > 0)
    decode, verified = times[4:-4], verifying[4:-4]  # past the prefill, before the last rows finish
    return sum(decode) / len(decode), sum(verified) / len(verified)


def break_even(ratio: float, k: int) -> float | None:
    """The per-token acceptance rate at which ``k`` proposals pay for a step ``ratio``
    times a plain one; None when even acceptance 1 (``k + 1`` tokens) does not."""
    if ratio > k + 1:
        return None
    low, high = 0.0, 1.0
    for _ in range(50):
        mid = (low + high) / 2
        tokens = sum(mid**i for i in range(k + 1))
        low, high = (mid, high) if tokens < ratio else (low, mid)
    return round(high, 3)


def verify_costs(model: str, steps: int, ks: Sequence[int] = range(1, 9)) -> list[dict[str, Any]]:
    rows = []
    plain = LLM(model, load_format="dummy", gpu_memory_utilization=0.5)
    base = {b: _mean_decode_step_s(plain.engine, b, steps)[0] for b in (1, 8)}
    del plain
    gc.collect()
    torch.cuda.empty_cache()
    for k in ks:
        spec = {"num_speculative_tokens": k}
        llm = LLM(model, load_format="dummy", gpu_memory_utilization=0.5, speculative_config=spec)
        engine = llm.engine
        engine.runner.proposal_mode = ProposalMode.REPEAT
        engine.scheduler.gate = _AlwaysOpen(k)  # type: ignore[assignment]
        graphs = engine.runner.graphs
        for batch in (1, 8):
            step_s, verified = _mean_decode_step_s(engine, batch, steps, k)
            ratio = step_s / base[batch]
            row = {
                "k": k,
                "batch": batch,
                "plain_step_ms": round(base[batch] * 1e3, 3),
                "verify_step_ms": round(step_s * 1e3, 3),
                "ratio": round(ratio, 3),
                "break_even_acceptance": break_even(ratio, k),
                "verify_share": round(verified, 3),
                "graph_cost": None if graphs is None else graphs.verify_costs.get(batch),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        del llm, engine, graphs
        gc.collect()
        torch.cuda.empty_cache()
    return rows


NGRAM_BURST = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}


def burst(model: str, rounds: int) -> list[dict[str, Any]]:
    """``burst256`` (dummy weights, greedy) without and with n-gram speculation, in turns."""
    rows = []
    for round_ in range(rounds):
        for speculative in (None, NGRAM_BURST):
            llm = LLM(model, load_format="dummy", speculative_config=speculative)
            vocab = llm.engine.model_config.vocab_size
            workload = make_workload("burst256", vocab)
            warmup = make_workload("burst256", vocab, 8, seed=1).capped(8)
            result = run_infer(llm.engine, workload, warmup, progress=False)
            tokens = sum(r.output_tokens for r in result.requests if r.ok)
            row = {
                "round": round_,
                "speculation": speculative is not None,
                "output_tok_s": round(tokens / result.duration_s, 1),
                **({"speculation_stats": result.extra["speculation"]} if speculative else {}),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            del llm
            gc.collect()
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, help="SmolLM2's GGUF (default: the embedded one)")
    parser.add_argument("--folder", type=Path, default=Path("/tmp/smollm2-hf"))
    parser.add_argument("--parts", default="quoting,verify")
    parser.add_argument("--dummy-model", default="llama-3.2-3b")
    parser.add_argument("--vllm", action="store_true", help="also vLLM's n-gram speculation")
    parser.add_argument("--max-tokens", type=int, default=256, help="outputs (verify: steps)")
    parser.add_argument("--rounds", type=int, default=2, help="burst: runs of each setting")
    parser.add_argument("--output", type=Path, default=Path("speculative.json"))
    parser.add_argument("--scoreboard", action="store_true")
    args = parser.parse_args()
    parts = args.parts.split(",")
    record: dict[str, Any] = {"ngram": NGRAM, "max_tokens": args.max_tokens}
    if "quoting" in parts:
        from infer.loader.presets import embedded_model_path

        folder = write_gguf_checkpoint(args.folder, args.gguf or embedded_model_path())
        engines = ["infer", "vllm"] if args.vllm else ["infer"]
        record["quoting"] = [r for e in engines for r in quoting(e, folder, args.max_tokens)]
    if "verify" in parts:
        record["verify"] = verify_costs(args.dummy_model, args.max_tokens)
    if "burst" in parts:
        record["burst"] = burst(args.dummy_model, args.rounds)
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    if args.scoreboard and "quoting" in record:
        figures = {
            f"speculative/smollm2-135m/quoting/{r['engine']}/batch{r['batch']}/"
            f"{'ngram' if r['speculation'] else 'plain'}/output_tok_s": (r["output_tok_s"], "tok/s")
            for r in record["quoting"]
        }
        scoreboard.update_many(figures, sampling="greedy")
    print_table(record)


def print_table(record: dict[str, Any]) -> None:
    """The record's rows (a part that failed holds its error instead: skipped)."""
    record = {k: v for k, v in record.items() if isinstance(v, list)}
    for row in record.get("quoting", []):
        spec = row.get("speculation_stats", {})
        print(
            f"{row['engine']:5} batch {row['batch']} {'ngram' if row['speculation'] else 'plain':5}"
            f" {row['output_tok_s']:>9,.1f} tok/s  acceptance {spec.get('acceptance_rate', '-')}"
            f"  identical {row.get('identical_to_plain', '-')}"
        )
    for row in record.get("verify", []):
        print(
            f"k={row['k']} batch {row['batch']}: {row['verify_step_ms']:.2f} ms vs "
            f"{row['plain_step_ms']:.2f} ms ({row['ratio']:.2f}x), break-even acceptance "
            f"{row['break_even_acceptance']}, verifying {row['verify_share']:.0%} of steps"
        )
    runs = record.get("burst", [])
    for speculative in (False, True):
        rates = [r["output_tok_s"] for r in runs if r["speculation"] is speculative]
        if rates:
            print(f"burst256 speculation {'on ' if speculative else 'off'}: {rates} tok/s")
    on, off = ([r["output_tok_s"] for r in runs if r["speculation"] is s] for s in (True, False))
    if on and off:
        print(f"burst256 on / off (medians): {statistics.median(on) / statistics.median(off):.3f}")


if __name__ == "__main__":
    main()
