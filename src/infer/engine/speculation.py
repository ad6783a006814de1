"""Speculative decoding: propose tokens a request is likely to produce next, let the target
model score them all in one step, keep the longest prefix it agrees with.

Proposals are n-grams of the request's own prompt and output (``NgramProposer``). The
target samples every proposed position with the row's own settings, and the sample at a
position counts only while every proposal before it equals the sample before it
(``accepted_length``). A proposal here is one token, not a distribution, so this *is*
rejection sampling: the proposal survives with the target's probability of it, and a
rejected position's sample is the target's distribution without that token. A seeded row
draws each output's noise from (seed, output index), so it samples the same tokens with
speculation as without.

Speculating runs its steps synchronously (a proposal reads the tokens so far), so when
proposals stop paying off, ``SpeculationGate`` turns it off for a while and the engine
schedules ahead again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from infer.kernels.verify_inputs import ngram_lookup
from infer.speculative_config import SpeculativeConfig

if TYPE_CHECKING:
    from infer.engine.request import Request

# The gate: over the last ``_WINDOW`` steps that could speculate, fewer than ``_MIN_GAIN``
# accepted tokens a step do not pay for giving up scheduling ahead; it closes for
# ``_PAUSE`` steps, then tries again.
_WINDOW = 16
_MIN_GAIN = 0.25
_PAUSE = 64


class Proposer(Protocol):
    """Where proposals come from (``NgramProposer``, ``DraftModelProposer``)."""

    def propose(self, requests: list[Request], limits: list[int]) -> list[list[int]]:
        """Up to ``limits[i]`` tokens that may follow each request's known tokens."""
        ...

    def forget(self, request: Request) -> None:
        """The request left the running batch (finished or preempted)."""
        ...


class NgramProposer:
    """The tokens that followed an earlier occurrence of the sequence's last ``n`` tokens,
    for the longest ``n`` in [``prompt_lookup_min``, ``prompt_lookup_max``] that has one."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max

    def propose(self, requests: list[Request], limits: list[int]) -> list[list[int]]:
        return [self.lookup(r.token_ids, limit) for r, limit in zip(requests, limits)]

    def forget(self, request: Request) -> None:
        pass  # it keeps nothing

    def lookup(self, token_ids: list[int], max_tokens: int) -> list[int]:
        return ngram_lookup(token_ids, max_tokens, self.min_n, self.max_n)


def accepted_length(proposals: list[int], samples: list[int]) -> int:
    """How many samples stand: the first, and each next while the proposal it was scored
    after equals the sample before it (``len(samples) == len(proposals) + 1``)."""
    count = 1
    for proposal, sample in zip(proposals, samples):
        if proposal != sample:
            break
        count += 1
    return count


@dataclass
class SpeculationStats:
    """Totals since start: steps that checked proposals, tokens proposed and accepted."""

    num_verify_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    def record(self, proposed: int, accepted: int) -> None:
        self.num_verify_steps += 1
        self.num_draft_tokens += proposed
        self.num_accepted_tokens += accepted

    def since(self, earlier: SpeculationStats) -> SpeculationStats:
        """What was counted after ``earlier`` (a copy taken then)."""
        return SpeculationStats(
            self.num_verify_steps - earlier.num_verify_steps,
            self.num_draft_tokens - earlier.num_draft_tokens,
            self.num_accepted_tokens - earlier.num_accepted_tokens,
        )

    def as_dict(self) -> dict[str, float | int]:
        return {
            "verify_steps": self.num_verify_steps,
            "draft_tokens": self.num_draft_tokens,
            "accepted_tokens": self.num_accepted_tokens,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_length": round(self.mean_accepted_length, 4),
        }

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a proposing row produced per verification, its own sample included."""
        if not self.num_verify_steps:
            return 0.0
        return 1.0 + self.num_accepted_tokens / self.num_verify_steps


class SpeculationGate:
    """Whether the next step speculates: the batch is small enough, and recent steps that
    could speculate gained enough accepted tokens to pay for running synchronously."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        self._gains: deque[int] = deque(maxlen=_WINDOW)
        self._paused = 0

    def is_open(self, batch_size: int) -> bool:
        return self._paused == 0 and self.config.speculates_at(batch_size)

    def record(self, accepted: int) -> None:
        """A synchronous step that could speculate gained ``accepted`` tokens."""
        self._gains.append(accepted)
        if len(self._gains) == _WINDOW and sum(self._gains) < _MIN_GAIN * _WINDOW:
            self._paused = _PAUSE
            self._gains.clear()

    def tick(self) -> None:
        """One step ran while closed."""
        self._paused = max(self._paused - 1, 0)
