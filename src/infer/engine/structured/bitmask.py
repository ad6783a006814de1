"""A step's token bitmasks, filled in the background: ``start_bitmask`` starts filling the
constrained rows' masks in llguidance's threads (the GIL released) after the step's forward
pass was queued; for a step scheduled ahead, as soon as the previous step's tokens reach the
host, while the engine records those tokens and schedules the next step (``RunAhead``);
the sampler waits for the masks. Each matcher first consumes the request's output tokens it
has not seen; a preempted request keeps its output tokens, so its matcher stays valid.
Requests without a constraint cost nothing: no mask is built when no row has one.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch
from llguidance import LLExecutor
from torch import Tensor

from infer.engine.structured.grammar_cache import CatchUp, grammar_threads
from infer.gil import hand_over_gil_often

if TYPE_CHECKING:
    from infer.engine.core.request import Request


@functools.cache
def _executor() -> LLExecutor:
    """llguidance's threads, filling several masks at once (made on first use)."""
    return LLExecutor(grammar_threads())


@functools.cache
def _filler() -> ThreadPoolExecutor:
    """The thread that waits on llguidance's (the GIL released) while the step goes on; it
    runs Python between them, so the engine's thread hands it the GIL often (``infer.gil``)."""
    hand_over_gil_often()
    return ThreadPoolExecutor(1, thread_name_prefix="infer-bitmask")


class Bitmask:
    """A step's token bitmasks, filled in the background: the constrained rows' indices and
    ``[R, ceil(vocab_size / 32)]`` int32 words on the host (bit ``t % 32`` of word ``t //
    32`` set: token ``t`` allowed), pinned for a CUDA device so their copy does not wait."""

    def __init__(self, rows: list[int], bits: Tensor, filled: Future[float]) -> None:
        self.rows = rows
        self._bits = bits
        self._filled = filled

    def result(self) -> tuple[list[int], Tensor]:
        """The rows and their masks, once filled."""
        self._filled.result()
        return self.rows, self._bits

    @property
    def fill_s(self) -> float:
        """How long llguidance took to fill them (seconds; once filled)."""
        return self._filled.result()


def _catch_up(catch_ups: list[CatchUp]) -> None:
    """Bring the matchers to their requests' tokens (given in lexer order): the usual one
    new token each in parallel (llguidance's threads), anything else one matcher at a time.
    A token a matcher cannot consume leaves it in its error state (``RequestGrammar.fail``)."""
    singles = [c for c in catch_ups if len(c.tokens) == 1 and not c.rollback]
    for c in catch_ups:
        if len(c.tokens) != 1 or c.rollback:
            c.apply()
    if singles:
        _executor().consume_token_par([(c.matcher, c.tokens[0]) for c in singles])


def start_bitmask(
    requests: list[Request],
    vocab_size: int,
    device: torch.device,
    pending: Mapping[str, int] | None = None,
    proposed: list[list[int]] | None = None,
) -> Bitmask | None:
    """Start filling the masks of a step's constrained rows (None when no row is): in the
    background, each matcher first consumes the request's output tokens it has not seen,
    and ``pending`` (request id → a token sampled for it that the host has not recorded
    yet), then llguidance's threads fill the masks, while the caller goes on. A row whose
    request has finished (its sampling was deferred, ``Engine.step``) gets no mask: its
    token will be dropped. ``proposed``: each row's proposed tokens before it (speculation:
    a request's rows follow each other); its mask is the grammar's after them, and a row
    after a proposal the grammar forbids allows everything (its sample cannot stand)."""
    rows = [i for i, r in enumerate(requests) if r.grammar is not None and not r.is_finished]
    if not rows:
        return None
    pending = pending or {}
    proposed = proposed or [[] for _ in requests]
    catch_ups = []
    slots = []  # each matcher's first row among ``rows``
    drafts: list[list[int]] = []  # the proposals its later rows follow
    for n, i in enumerate(rows):
        request = requests[i]
        assert request.grammar is not None
        if proposed[i]:
            drafts[-1] = proposed[i]
            continue
        catch_ups.append(request.grammar.catch_up(request, pending.get(request.request_id)))
        slots.append(n)
        drafts.append([])
    words = (vocab_size + 31) // 32
    bits = torch.empty((len(rows), words), dtype=torch.int32, pin_memory=device.type == "cuda")
    if any(drafts):  # rows after a forbidden proposal are not written
        bits.fill_(-1)

    # Matchers of one lexer side by side: llguidance's threads split the list into runs,
    # so a thread mostly takes the lock of a lexer no other thread is using.
    by_lexer = sorted(range(len(catch_ups)), key=lambda k: catch_ups[k].lexer)

    def fill() -> float:
        start = time.perf_counter()
        _catch_up([catch_ups[k] for k in by_lexer])
        if any(drafts):  # each draft's mask after the slot before it, the matcher rolled back
            with_drafts = [(catch_ups[k].matcher, slots[k], drafts[k]) for k in by_lexer]
            _executor().unsafe_compute_mask_ptr_with_draft_token(
                with_drafts, bits.data_ptr(), words * 4, len(rows)
            )
        elif len(catch_ups) == 1:
            catch_ups[0].matcher.unsafe_compute_mask_ptr(bits.data_ptr(), words * 4)
        else:
            matchers = [(catch_ups[k].matcher, slots[k]) for k in by_lexer]
            _executor().unsafe_compute_mask_ptr(matchers, bits.data_ptr(), words * 4, len(rows))
        for k in [k for k, c in enumerate(catch_ups) if c.matcher.is_error()]:
            request = requests[rows[slots[k]]]
            assert request.grammar is not None
            request.grammar.fail(request, catch_ups[k].matcher)
        return time.perf_counter() - start

    return Bitmask(rows, bits, _filler().submit(fill))
