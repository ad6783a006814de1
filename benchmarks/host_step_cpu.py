"""The engine's host work per decode step, on a CPU: the model pass is replaced by nothing
(what the graph runner does on the host, ``host_batch``, still runs) and sampling by random
tokens, so a step costs only scheduling, input building, bookkeeping, detokenisation and
outputs, the part that must stay below the GPU's step time for the device never to wait.

    python benchmarks/host_step_cpu.py [--rows 256] [--steps 300] [--no-detokenize]
    python benchmarks/host_step_cpu.py --profile spy.txt   # py-spy (raw) of the measured steps
    python benchmarks/host_step_cpu.py --served            # each step's events sent as the
                                                           # server's engine process sends them
    python benchmarks/host_step_cpu.py --schema            # every row under bench_structured's
                                                           # JSON schema (grammar masks filled)

Needs a checkpoint folder with a tokenizer (``--model``, default: the tiny one this script
writes into ``.cache/host-step-ckpt``: llama shapes shrunk to 2 layers, SmolLM2's tokenizer).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from bench_structured import SCHEMA  # beside this script
from infer import LLM, SamplingParams
from infer.attention.metadata import host_batch
from infer.bench.checkpoint import write_checkpoint
from infer.contract.pipes import PipeEnds
from infer.contract.sampling_params import StructuredOutputsParams
from infer.engine.core import runner as runner_module
from infer.engine.core.engine import Engine
from infer.engine.core.prompt_logprobs import PromptScores
from infer.engine.core.runner import StepInputs
from infer.engine.core.sampler import SamplerOutput
from infer.engine.core.step import Step
from infer.engine.process import _ApiLink, _EngineLoop
from infer.engine.structured.bitmask import Bitmask
from infer.heap import IdleCollections, frozen_heap

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": 49152}  # fmt: skip


def tiny_checkpoint(folder: Path) -> Path:
    """llama-3.2-3b's config shrunk to a few parameters, with SmolLM2's tokenizer."""
    write_checkpoint(folder, "llama-3.2-3b")
    config = json.loads((folder / "config.json").read_text())
    if config.get("hidden_size") != TINY["hidden_size"]:
        config.update(TINY)
        config.pop("bos_token_id", None)
        (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def null_model(llm: LLM, max_rows: int) -> None:
    """No model pass (the graph runner's host part only), random tokens for samples: for a
    constrained row one its mask allows (a random word of the mask with a bit set, its
    lowest bit), as random weights pick."""
    runner = llm.engine.runner
    block_size = llm.engine.pool.block_size

    def run_model(
        step: StepInputs, input_ids: torch.Tensor | None
    ) -> tuple[torch.Tensor, PromptScores | None]:
        if step.num_tokens <= max_rows:
            host_batch(step.sequences, block_size, max_rows, max_rows)
        return torch.empty(0), None

    def sample(step: Step, bitmask: Bitmask | None = None) -> None:
        if step.logits is None:  # no row samples
            return
        step.logits = None
        tokens = torch.randint(1000, 40000, (len(step.rows),))
        if bitmask is not None:
            rows, bits = bitmask.result()
            priority = torch.rand(bits.shape[1])
            word = ((bits != 0) * priority).argmax(dim=1)
            value = bits.gather(1, word[:, None])[:, 0].to(torch.int64) & 0xFFFFFFFF
            lowest = torch.log2((value & -value).to(torch.float64)).to(torch.int64)
            tokens[torch.tensor(rows)] = word * 32 + lowest
        runner_module._copy_to_host(step, SamplerOutput(tokens))

    runner.run_model = run_model  # type: ignore[method-assign]
    runner.sample = sample  # type: ignore[method-assign]


def _drain(events: Connection) -> None:
    with contextlib.suppress(EOFError):
        while True:
            events.recv()


def served_step(engine: Engine, request_ids: list[str]) -> Callable[[], object]:
    """A step as the server's engine process runs it: the events of ``request_ids`` are sent
    to a process that reads them as the API process does (and drops them)."""
    context = multiprocessing.get_context("spawn")
    reader, writer = context.Pipe(duplex=False)
    context.Process(target=_drain, args=(reader,), daemon=True).start()
    commands, _ = context.Pipe(duplex=False)
    api = _ApiLink(PipeEnds(commands, writer))
    loop = _EngineLoop(engine, [api], IdleCollections())
    loop.owners = dict.fromkeys(request_ids, api)
    return lambda: loop._send_step(engine.step())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--no-detokenize", action="store_true")
    parser.add_argument("--profile", type=Path, help="py-spy raw samples of the measured part")
    parser.add_argument(
        "--served", action="store_true", help="send each step's events to another process"
    )
    parser.add_argument(
        "--schema", action="store_true", help="every row under bench_structured.py's schema"
    )
    args = parser.parse_args()
    model = args.model or tiny_checkpoint(Path(".cache/host-step-ckpt"))
    llm = LLM(str(model), load_format="dummy", max_seq_len=4096, device="cpu",
              max_batch_size=args.rows)  # fmt: skip
    null_model(llm, args.rows)
    engine = llm.engine
    rng = random.Random(0)
    constraint = StructuredOutputsParams(json=SCHEMA) if args.schema else None
    params = SamplingParams(
        temperature=0.0,
        max_tokens=3500,
        ignore_eos=not args.schema,
        detokenize=not args.no_detokenize,
        structured_outputs=constraint,
    )
    for i in range(args.rows):
        prompt = [rng.randrange(1000, 40000) for _ in range(rng.randint(128, 384))]
        engine.add_request(prompt, params, f"r{i}")
    for _ in range(20):  # prompts done, every row decoding
        engine.step()
    spy = None
    if args.profile is not None:
        command = ["py-spy", "record", "-p", str(os.getpid()), "-r", "400", "-f", "raw"]
        spy = subprocess.Popen([*command, "-o", str(args.profile), "--nonblocking"])
        time.sleep(1.0)
    step = served_step(engine, [f"r{i}" for i in range(args.rows)]) if args.served else engine.step
    times: list[float] = []
    with frozen_heap():  # as in the benchmarks and the server
        for _ in range(args.steps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    if spy is not None:
        spy.send_signal(2)
        spy.wait()
    result: dict[str, Any] = {
        "rows": args.rows,
        "schema": args.schema,
        "detokenize": not args.no_detokenize,
        "host_ms_per_step_p50": round(1000 * statistics.median(times), 3),
        "host_ms_per_step_mean": round(1000 * statistics.fmean(times), 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
