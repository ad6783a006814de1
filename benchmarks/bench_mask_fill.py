"""The host's per-step grammar work at batch scale, on the CPU (issue 17): ``burst256``'s
shape, 256 rows under ``bench_structured.py``'s JSON schema with SmolLM2's tokenizer and
llama-3.2-3b's 128,256-entry vocabulary, one token per row per step, as the engine's step
loop feeds them.

    python benchmarks/bench_mask_fill.py [--rows 256] [--paths random|instances]
        [--lexers 1,16] [--steps 60] [--tokenizer DIR]

``--paths instances``: each row writes its own instance of the schema (what a trained model
writes). ``--paths random``: each row takes a token at random from those its mask allows, as
``bench_structured.py``'s dummy weights do (strings of arbitrary tokens, the costly case).
``--lexers``: the grammar compiled this many times, the rows' matchers copied from them in
turn (``grammar_cache.CompiledGrammar``); every count runs the same token paths. Each step times
the grammar part of a step (``start_bitmask``: the matchers consume their new token and the
masks are filled in llguidance's threads, ``INFER_GRAMMAR_THREADS`` of them), and the report
gives, per lexer count, the total over all steps, the first step apart (lexer states are
built lazily) and the worst step.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import torch

from bench_structured import SCHEMA
from infer.contract.constraints import grammar_for
from infer.contract.sampling_params import SamplingParams, StructuredOutputsParams
from infer.engine.core.request import Request
from infer.engine.structured.bitmask import start_bitmask
from infer.engine.structured.grammar_cache import CompiledGrammar, RequestGrammar, StructuredOutputs
from infer.loader import resolve_model
from infer.tokenizer import Tokenizer

VOCAB = 128256  # dummy llama-3.2-3b's, as bench_structured.py runs it


def _instance(rng: random.Random) -> str:
    words = ["alpha", "beta", "gamma", "delta", "red", "blue", "x", "Zurich", "node-7"]
    value = {
        "name": " ".join(rng.choice(words) for _ in range(rng.randint(1, 4)))[:40],
        "age": rng.randint(0, 120),
        "tags": [rng.choice(words)[:12] for _ in range(rng.randint(0, 8))],
        "address": {"city": rng.choice(words), "zip": str(rng.randint(10000, 99999))},
    }
    return json.dumps(value)


def _rows(compiled: CompiledGrammar, count: int) -> list[Request]:
    future: Future[CompiledGrammar] = Future()
    future.set_result(compiled)
    params = SamplingParams(structured_outputs=StructuredOutputsParams(json=SCHEMA))
    rows = [Request(str(i), [1, 2, 3], 3, params, seed=0) for i in range(count)]
    for request in rows:
        request.grammar = RequestGrammar(future)
    return rows


def _random_allowed(bits: torch.Tensor, rng: np.random.Generator) -> list[int]:
    allowed = np.unpackbits(bits.numpy().view(np.uint8), axis=1, bitorder="little")[:, :VOCAB]
    return [int(rng.choice(np.flatnonzero(row))) if row.any() else -1 for row in allowed]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--paths", choices=["random", "instances"], default="random")
    parser.add_argument("--lexers", default="1,16", help="lexer counts to compare")
    parser.add_argument("--steps", type=int, default=60, help="at most this many steps")
    parser.add_argument("--tokenizer", help="a directory with tokenizer.json (SmolLM2's)")
    args = parser.parse_args()
    path = args.tokenizer or resolve_model("smollm2-135m").tokenizer_path
    assert path is not None
    tokenizer = Tokenizer.load(Path(path))
    assert tokenizer is not None
    grammar = grammar_for("json", SCHEMA)
    lltokenizer = StructuredOutputs(tokenizer, VOCAB)._tokenizer()
    counts = [int(c) for c in args.lexers.split(",")]
    runs = {}
    for count in counts:
        compiled = CompiledGrammar(lltokenizer, grammar)
        compiled.add_lexers(count)
        runs[count] = _rows(compiled, args.rows)
    instances = random.Random(0)
    paths = [
        tokenizer.hf.encode(_instance(instances), add_special_tokens=False)
        for _ in range(args.rows)
    ]
    rng = np.random.default_rng(0)
    seconds: dict[int, list[float]] = {count: [] for count in counts}
    device = torch.device("cpu")
    for step in range(args.steps):
        live = [k for k in range(args.rows) if args.paths == "random" or step < len(paths[k])]
        if not live:
            break
        filled = {}
        for count in counts:
            batch = [runs[count][k] for k in live]
            start = time.perf_counter()
            started = start_bitmask(batch, VOCAB, device)
            assert started is not None
            filled[count] = started.result()[1]
            seconds[count].append(time.perf_counter() - start)
        if args.paths == "random":
            chosen = _random_allowed(filled[counts[0]], rng)
        else:
            chosen = [paths[k][step] for k in live]
        for count in counts:
            for k, token in zip(live, chosen):
                runs[count][k].token_ids.append(token)
        if any(token < 0 for token in chosen):  # a row's grammar ended: stop all
            break
    for count in counts:
        times = seconds[count]
        print(
            f"{args.rows} rows, {args.paths} paths, {count} lexer(s): {len(times)} steps,"
            f" fills {1e3 * sum(times):.0f} ms, first step {1e3 * times[0]:.1f} ms,"
            f" worst {1e3 * max(times):.1f} ms"
        )


if __name__ == "__main__":
    main()
