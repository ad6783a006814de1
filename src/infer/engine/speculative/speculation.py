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

N-gram proposals are made on the device where the engine can (``verify_step``): such steps
are queued ahead like plain ones. Other proposals (a draft model's) read the tokens so far on
the host, so those steps run synchronously. Either way ``SpeculationGate`` keeps proposals to
the requests and batches where they pay for what checking them costs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from infer.kernels.verify_inputs import ngram_lookup
from infer.speculative_config import SpeculativeConfig

if TYPE_CHECKING:
    from infer.engine.core.request import Request


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


class VerifyCosts:
    """What a step that checks proposals costs, over a plain decode step of as many rows.

    Steps verifying device proposals run captured graphs whose times were measured against
    the decode graphs' (``CUDAGraphRunner.measure_verify_costs``), by rows; without those
    (the CPU) they are taken to cost ``_UNMEASURED`` times a plain step. A step with host
    proposals waits for the host and runs a mixed step: ``HOST_PROPOSALS`` times.
    """

    def __init__(
        self, by_rows: dict[int, float] | None = None, max_rows: int | None = None
    ) -> None:
        """``max_rows``: the widest verify step, measured or not."""
        self.by_rows = dict(sorted((by_rows or {}).items()))
        self.max_rows = max_rows

    def device(self, batch_size: int) -> float | None:
        """A verify step's cost at ``batch_size`` rows; None where no graph holds them (or
        they are more than ``max_rows``)."""
        if self.max_rows is not None and batch_size > self.max_rows:
            return None
        if not self.by_rows:
            return _UNMEASURED
        return next((cost for rows, cost in self.by_rows.items() if rows >= batch_size), None)


# Measured on an H100 at c9900b1 (benchmarks/results-by-topic/15-speculative.md, 15.2: the
# verify table's column before issue 51).
HOST_PROPOSALS = 1.3
_UNMEASURED = 1.05
# Each request's gain is an average that weighs its latest observation by ``_RECENT``; a new
# request starts at ``_FIRST_GAIN`` accepted tokens a step (it gets to propose), and a row
# keeps proposing while its gain covers at least ``_MIN_NEED`` of the step's extra cost.
_RECENT = 0.3
_FIRST_GAIN = 1.0
_MIN_NEED = 0.05
# Requests that do not propose are checked in the shadow (their own n-gram against the tokens
# they went on to produce), at most so many a step and each so often, so that they resume
# when proposals would pay.
_SHADOW_CHECKS_PER_STEP = 2
_SHADOW_EVERY = 8


@dataclass
class _Shadow:
    start: int  # the request's length when the lookup ran: the proposal's first position
    proposal: list[int]


class SpeculationGate:
    """Which requests propose in the next step: per request, the accepted proposals a step
    has gained lately; per step, whether what the proposing rows gain pays for the step's
    extra cost (``VerifyCosts``: a wide batch is compute-bound and cannot pay).

    A row proposes while its gain covers its share of the extra cost (the break-even), and
    the step speculates while the proposing rows' gains cover all of it. Requests that stop
    proposing are checked in the shadow where a ``shadow`` lookup is given (their n-gram
    proposals against the tokens they produce without them), so they resume when their
    acceptance recovers; without one, each tries again every so often.
    """

    def __init__(
        self,
        config: SpeculativeConfig,
        shadow: Callable[[list[int], int], list[int]] | None = None,
    ) -> None:
        self.config = config
        self.shadow = shadow
        self._gains: dict[str, float] = {}
        self._shadows: dict[str, _Shadow] = {}
        self._idle: dict[str, int] = {}  # steps since a request without shadows proposed

    def limits(self, requests: list[Request], cost: float | None) -> list[int]:
        """How many proposals each request may take in a step costing ``cost`` times a plain
        one (None: no such step can run); all zero: the step does not speculate."""
        count, wanted = len(requests), self.config.num_speculative_tokens
        if cost is None or cost >= wanted + 1 or not self.config.speculates_at(count):
            return [0] * count
        need = max(cost - 1.0, _MIN_NEED)
        # A request trying again is taken to pay its share: the step finds out.
        gains = [need if self._retries(r) else self.gain(r) for r in requests]
        proposing = [g >= need for g in gains]
        if sum(g for g, p in zip(gains, proposing) if p) < need * count:
            return [0] * count
        return [wanted if p else 0 for p in proposing]

    def gain(self, request: Request) -> float:
        """The accepted proposals a step has gained the request lately."""
        return self._gains.get(request.request_id, _FIRST_GAIN)

    def record(self, request: Request, accepted: int) -> None:
        """A step in which the request could propose accepted ``accepted`` proposals."""
        key = request.request_id
        self._gains[key] = (1 - _RECENT) * self.gain(request) + _RECENT * accepted
        self._shadows.pop(key, None)
        self._idle.pop(key, None)

    def observe(self, requests: list[Request]) -> None:
        """Requests that did not propose in the step just collected: check their shadow
        proposals against what they produced, and look up new ones (each request every
        ``_SHADOW_EVERY`` steps, a few a step: the host's share of a plain step stays small)."""
        budget = _SHADOW_CHECKS_PER_STEP
        for request in requests:
            key = request.request_id
            idle = self._idle[key] = self._idle.get(key, 0) + 1
            if self.shadow is None:
                continue
            pending = self._shadows.get(key)
            if pending is not None:
                self._settle(request, pending)
            elif budget > 0 and idle >= _SHADOW_EVERY:
                budget -= 1
                self._idle[key] = 0
                tokens = request.token_ids
                proposal = self.shadow(tokens, self.config.num_speculative_tokens)
                if proposal:
                    self._shadows[key] = _Shadow(len(tokens), proposal)
                else:
                    self.record(request, 0)

    def forget(self, request: Request) -> None:
        key = request.request_id
        self._gains.pop(key, None)
        self._shadows.pop(key, None)
        self._idle.pop(key, None)

    def _settle(self, request: Request, pending: _Shadow) -> None:
        """Score a shadow proposal once the tokens it guessed are known (or one differs)."""
        produced = request.token_ids[pending.start : pending.start + len(pending.proposal)]
        accepted = accepted_length(pending.proposal, produced) - 1
        if accepted < len(produced) or len(produced) == len(pending.proposal):
            self.record(request, accepted)

    def _retries(self, request: Request) -> bool:
        """Without shadow checks, a request that stopped proposing tries again now and then."""
        return self._idle.get(request.request_id, 0) >= _RETRY_AFTER


_RETRY_AFTER = 64
