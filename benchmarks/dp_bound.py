"""The most ``-dp N`` can gain over one replica on a burst, by the roofline of
``infer.bench.roofline`` (prefill at the matmul rate, each decode step reading every weight
and its rows' K/V at the copy rate): each replica's share of the requests (every N-th, as
the router spreads a burst of unshared prompts) on a GPU of its own, against all of them on
one. The ceilings default to an H200's measured ones (``infer bench offline`` prints them).

    PYTHONPATH=src python benchmarks/dp_bound.py [--model llama-3.2-3b] [--workload burst256]
        [--replicas 2] [--copy-tb-s 4.222] [--matmul-tflops 801.8]
"""

from __future__ import annotations

import argparse
import dataclasses

from infer.bench.roofline import workload_roofline
from infer.config import ModelConfig
from infer.loader import resolve_model
from infer.workloads import make_workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.2-3b")
    parser.add_argument("--workload", default="burst256")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--copy-tb-s", type=float, default=4.222)
    parser.add_argument("--matmul-tflops", type=float, default=801.8)
    args = parser.parse_args()
    config = ModelConfig.from_hf_dict(resolve_model(args.model).hf_config)
    workload = make_workload(args.workload, config.vocab_size)
    ceilings = {"copy_tb_s": args.copy_tb_s, "matmul_tflops": args.matmul_tflops}
    whole = workload_roofline(config, workload, ceilings)
    shares = [
        workload_roofline(
            config, dataclasses.replace(workload, requests=workload.requests[i :: args.replicas]),
            ceilings,
        )
        for i in range(args.replicas)
    ]  # fmt: skip
    slowest = max(shares, key=lambda s: s["prefill_s"] + s["decode_s"])
    rates = f"{args.copy_tb_s} TB/s, {args.matmul_tflops} TFLOP/s"
    print(f"{args.model}, {args.workload}, ceilings {rates}")
    for label, bound in [("one replica", whole), (f"{args.replicas} replicas", slowest)]:
        step_gb = bound["decode_bytes"] / bound["decode_steps"] / 1e9
        print(
            f"  {label}: prefill {bound['prefill_s']:.3f} s + decode {bound['decode_s']:.3f} s "
            f"({step_gb:.2f} GB a step, {bound['weight_bytes_per_step'] / 1e9:.2f} of weights)"
        )
    total = whole["prefill_s"] + whole["decode_s"]
    print(
        f"  bound on the ratio: {total / (slowest['prefill_s'] + slowest['decode_s']):.2f}x "
        f"(decode alone {whole['decode_s'] / slowest['decode_s']:.2f}x, "
        f"prefill alone {whole['prefill_s'] / slowest['prefill_s']:.2f}x)"
    )


if __name__ == "__main__":
    main()
