"""The host's per-step grammar work at batch scale, on the CPU (issue 17): ``burst256``'s
shape, 256 rows under ``bench_structured.py``'s JSON schema with SmolLM2's tokenizer and
llama-3.2-3b's 128,256-entry vocabulary, each row following its own instance of the schema,
one token per step, as the engine's step loop would feed them.

    python benchmarks/bench_mask_fill.py [--rows 256] [--threads N]

Each step times ``SamplingBatch``'s grammar part (``_TokenBitmask.build``: the matchers
consume the tokens they have not seen and the masks are filled), and reports the mean, p50
and p99 over all steps, and the first step apart (where llguidance builds its lazy lexer
states).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from bench_structured import SCHEMA
from infer.engine.request import Request
from infer.engine.sampler import _TokenBitmask
from infer.engine.sampling_params import SamplingParams, StructuredOutputsParams
from infer.engine.structured import StructuredOutputs
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3, help="runs (the best mean is kept)")
    args = parser.parse_args()
    path = resolve_model("smollm2-135m").tokenizer_path
    assert path is not None
    tokenizer = Tokenizer.load(Path(path))
    assert tokenizer is not None
    grammars = StructuredOutputs(tokenizer, VOCAB)
    rng = random.Random(0)
    paths = [
        tokenizer.hf.encode(_instance(rng), add_special_tokens=False) for _ in range(args.rows)
    ]
    params = SamplingParams(
        temperature=0.0, structured_outputs=StructuredOutputsParams(json=SCHEMA)
    )
    device = torch.device("cpu")
    runs = []
    for _ in range(args.repeat):
        requests = []
        for i in range(args.rows):
            request = Request(str(i), [1, 2, 3], 3, params, seed=0)
            grammars.attach(request)
            assert request.grammar is not None
            request.grammar._compiled.result()
            requests.append(request)
        seconds = []
        step = 0
        while True:
            batch = [r for r, p in zip(requests, paths) if r.num_output_tokens < len(p)]
            if not batch:
                break
            start = time.perf_counter()
            _TokenBitmask.build(batch, VOCAB, device)
            seconds.append(time.perf_counter() - start)
            for r, p in zip(requests, paths):
                if r.num_output_tokens < len(p):
                    r.token_ids.append(p[r.num_output_tokens])
            step += 1
        runs.append(seconds)
    best = min(runs, key=statistics.mean)
    later = sorted(best[1:])
    p50, p99 = later[len(later) // 2], later[int(len(later) * 0.99)]
    print(
        f"{args.rows} rows, {len(best)} steps: first step {1e3 * best[0]:.2f} ms | later steps"
        f" mean {1e3 * statistics.mean(later):.2f} ms, p50 {1e3 * p50:.2f}, p99 {1e3 * p99:.2f}"
        f", max {1e3 * later[-1]:.2f} | all steps mean {1e3 * statistics.mean(best):.2f} ms"
    )


if __name__ == "__main__":
    main()
