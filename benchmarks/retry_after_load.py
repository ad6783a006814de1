"""``Retry-After`` at 10x load (issue 43): ``--clients`` clients retry on 503 as told against
a server holding ``--max-batch-size + --max-waiting-requests`` sequences, and the median
client's time to be served is set beside the sum of the waits it was told.

    python benchmarks/retry_after_load.py --clients 120 --max-tokens 40
    python benchmarks/retry_after_load.py --model smollm2-135m --clients 120 --max-tokens 16

By default the server runs the stand-in engine (a fixed ``--step-s`` per step: the rate is
the server's, not the CPU's); ``--model`` serves the real model on the CPU instead. Run it
with ``PYTHONPATH=OTHER/src`` to measure another checkout.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from infer import EngineConfig
from infer.bench.retrying_clients import run_clients, summarise
from infer.server.bridge.launch import spawn_server
from infer.server.bridge.standin_server import standin_server


@contextmanager
def model_server(args: argparse.Namespace) -> Iterator[str]:
    serve_args = ["--model", args.model, "--device", "cpu"]
    serve_args += ["--max-batch-size", str(args.max_batch_size)]
    serve_args += ["--max-waiting-requests", str(args.max_waiting_requests)]
    with spawn_server(serve_args) as server:
        yield server.url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=120)
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--max-batch-size", type=int, default=4)
    parser.add_argument("--max-waiting-requests", type=int, default=8)
    parser.add_argument("--step-s", type=float, default=0.01, help="the stand-in's step")
    parser.add_argument("--model", help="serve this model instead of the stand-in")
    parser.add_argument("--max-attempts", type=int, default=1000)
    args = parser.parse_args()
    config = EngineConfig(
        model="smollm2-135m",
        device="cpu",
        max_batch_size=args.max_batch_size,
        max_waiting_requests=args.max_waiting_requests,
    )
    served: AbstractContextManager[str] = (
        model_server(args) if args.model else standin_server(config, args.step_s)
    )
    body = {"prompt": "Hello", "max_tokens": args.max_tokens, "ignore_eos": True}
    with served as url:
        start = time.monotonic()
        runs = asyncio.run(run_clients(url, args.clients, body, args.max_attempts))
        took = time.monotonic() - start
    print(f"{summarise(runs)}; all served after {took:.1f} s")


if __name__ == "__main__":
    main()
