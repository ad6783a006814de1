"""The sampling settings a benchmark run sends with every request (greedy by default), the
same for ``infer`` and the vLLM peer, and recorded beside every figure."""

from __future__ import annotations

import argparse
import itertools
from collections import Counter
from dataclasses import asdict, dataclass

from infer.contract.sampling_params import SamplingParams


@dataclass(frozen=True)
class BenchSampling:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no limit (vLLM's -1)
    min_p: float = 0.0

    def __post_init__(self) -> None:
        self.params(max_tokens=1)  # a bad value raises ValueError naming its field

    @classmethod
    def from_label(cls, label: str) -> BenchSampling:
        """The inverse of ``label``: ``greedy``, or ``t0.7-p0.9-k50-minp0.05`` in any order."""
        if label == "greedy":
            return cls()
        fields = {"t": "temperature", "p": "top_p", "k": "top_k", "minp": "min_p"}
        values: dict[str, float | int] = {}
        for part in label.split("-"):
            key = part.rstrip("0123456789.")
            if key not in fields or key == part:
                raise ValueError(
                    f"sampling: {part!r} of {label!r} is not t<T>, p<P>, k<K> or minp<P>"
                )
            number = part[len(key) :]
            values[fields[key]] = int(number) if key == "k" else float(number)
        return cls(**values)  # type: ignore[arg-type]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def label(self) -> str:
        """``greedy``, or the settings that differ from the defaults (``t0.7-p0.9``)."""
        if self.greedy:
            return "greedy"
        parts = [f"t{self.temperature:g}"]
        parts += [f"p{self.top_p:g}"] if self.top_p < 1.0 else []
        parts += [f"k{self.top_k}"] if self.top_k > 0 else []
        parts += [f"minp{self.min_p:g}"] if self.min_p > 0.0 else []
        return "-".join(parts)

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)

    def params(self, max_tokens: int) -> SamplingParams:
        """infer's parameters for one benchmark request (EOS ignored: fixed lengths)."""
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            max_tokens=max_tokens,
            ignore_eos=True,
        )


GREEDY = BenchSampling()


def samplings_from_args(args: argparse.Namespace) -> list[BenchSampling]:
    """``--sampling a,b`` (each run in turn by the same engine), else the single flags."""
    single = BenchSampling(args.temperature, args.top_p, args.top_k, args.min_p)
    if not args.sampling:
        return [single]
    if single != GREEDY:
        raise ValueError("sampling: give either --sampling or --temperature/--top-p/...")
    return [BenchSampling.from_label(label) for label in args.sampling.split(",")]


def run_name(workload: str, sampling: BenchSampling) -> str:
    """A result's name: the workload's, with the sampling's label unless greedy."""
    return workload if sampling.greedy else f"{workload}-{sampling.label}"


def run_names(workloads: list[str], samplings: list[BenchSampling]) -> list[str]:
    """Each run's name, in the order of ``itertools.product(workloads, samplings)``: its
    ``run_name``, then ``-2``, ``-3``, ... on later runs of the same workload and sampling.
    A label given twice is two different runs (the first fills the prefix cache the second
    finds), so each needs a result file of its own."""
    seen: Counter[str] = Counter()
    names = []
    for workload, sampling in itertools.product(workloads, samplings):
        name = run_name(workload, sampling)
        seen[name] += 1
        names.append(name if seen[name] == 1 else f"{name}-{seen[name]}")
    return names


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: 0)")
    parser.add_argument("--top-p", type=float, default=1.0, help="default: 1 (off)")
    parser.add_argument("--top-k", type=int, default=0, help="default: 0 (off)")
    parser.add_argument("--min-p", type=float, default=0.0, help="default: 0 (off)")
    parser.add_argument(
        "--sampling",
        default=None,
        help="several settings, each run in turn by the same engine (instead of the flags "
        "above): labels such as greedy,t1,t0.7-p0.9,t1-k50,t1-minp0.05",
    )
