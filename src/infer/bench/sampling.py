"""The sampling settings a benchmark run sends with every request (greedy by default), the
same for ``infer`` and the vLLM peer, and recorded beside every figure."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass

from infer.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class BenchSampling:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no limit (vLLM's -1)
    min_p: float = 0.0

    def __post_init__(self) -> None:
        self.params(max_tokens=1)  # a bad value raises ValueError naming its field

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BenchSampling:
        return cls(args.temperature, args.top_p, args.top_k, args.min_p)

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


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: 0)")
    parser.add_argument("--top-p", type=float, default=1.0, help="default: 1 (off)")
    parser.add_argument("--top-k", type=int, default=0, help="default: 0 (off)")
    parser.add_argument("--min-p", type=float, default=0.0, help="default: 0 (off)")
