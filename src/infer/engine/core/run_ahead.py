"""Async scheduling: the steps the engine queues on the device ahead of its own bookkeeping.

With ``use_async_scheduling`` the engine (``Engine._step_ahead``) queues the next step before
it collects the one in flight: the rows that sampled take their tokens on the device, so the
host's work overlaps the device's and the device never waits between steps. When a step's
sampling reads the output so far on the host (a grammar's mask, penalties), only its forward
pass is queued ahead (it is *deferred*); it is sampled once the tokens it reads are
collected, its masks filling meanwhile.

Between two engine steps it holds the step in flight (launched and sampled, not collected)
and, behind it, at most one deferred step (launched, not sampled). Without async scheduling
the engine has none: each step is launched and collected within one engine step.
"""

from __future__ import annotations

from collections.abc import Callable

from infer.engine.core.pacing import LaunchPacer, StepShape
from infer.engine.core.runner import ModelRunner
from infer.engine.core.step import Step
from infer.engine.structured.bitmask import Bitmask, start_bitmask


def _shape(step: Step) -> StepShape:
    return step.num_tokens, len(step.chunks)


class RunAhead:
    """The steps queued ahead, carried from one engine step to the next."""

    def __init__(
        self,
        runner: ModelRunner,
        pacer: LaunchPacer | None,
        *,
        schedule_after: Callable[[Step], Step | None],
        launch: Callable[[Step, Step], None],
    ) -> None:
        """``schedule_after(step)``: the step after ``step`` (in flight), None when there is
        none to queue now; ``launch(step, previous)``: queue its forward pass behind
        ``previous``. Both are the engine's, which records the steps it schedules and
        counts those it launches."""
        self.runner = runner
        self.pacer = pacer
        self._schedule_after = schedule_after
        self._launch = launch
        self.in_flight: Step | None = None  # launched and sampled, not collected
        self.deferred: Step | None = None  # launched behind it, its sampling waiting
        self._bitmask: Bitmask | None = None  # the deferred step's masks, filling

    @property
    def busy(self) -> bool:
        return self.in_flight is not None or self.deferred is not None

    def queued(self) -> list[Step]:
        """The steps queued by the last engine step, in order."""
        return [s for s in (self.in_flight, self.deferred) if s is not None]

    def take(self) -> Step | None:
        """Hand over the step in flight, for the engine step to collect; a deferred step
        stays until ``sample_deferred``."""
        step, self.in_flight = self.in_flight, None
        return step

    def clear(self) -> None:
        """Forget what was queued (an engine step failed: its requests are recovered)."""
        self.in_flight = self.deferred = self._bitmask = None

    def wait_to_schedule(self) -> None:
        """Sleep until the step in flight is about to end (``LaunchPacer``), so that the
        requests taken in meanwhile join the step queued next."""
        if self.pacer is not None and self.in_flight is not None and self.deferred is None:
            self.pacer.wait(_shape(self.in_flight))

    def queue_next(self, step: Step) -> None:
        """Before ``step`` is collected, queue the step after it: launched and sampled, it
        becomes the step in flight; when its sampling reads ``step``'s tokens, it is only
        launched (deferred). Nothing when a deferred step is the next already, or the next
        step needs the host first."""
        if self.deferred is not None:
            return
        after = self._schedule_after(step)
        if after is None:
            return
        self._launch(after, step)
        if after.reads_outputs():
            self.deferred = after
            return
        self.runner.sample(after)
        self.in_flight = after

    def collect(self, step: Step) -> None:
        """Wait for the step's samples (a pacer also learns whether it was still running
        and whether the next was queued behind it); the deferred step starts filling its
        grammars' masks from them (the matchers consume them before ``update`` records
        them)."""
        runner, pacer = self.runner, self.pacer
        if pacer is None:
            runner.collect(step)
        else:
            pacer.launched()
            waited = not runner.is_done(step)
            runner.collect(step)
            pacer.collected(_shape(step), waited, self.in_flight is not None)
        deferred = self.deferred
        if deferred is None or deferred.logits is None:  # none, or none of its rows samples
            return
        pending = {
            c.request.request_id: token
            for c, token in zip(step.chunks_that_sample(), step.token_ids)
            if c.request.grammar is not None
        }
        self._bitmask = start_bitmask(deferred.rows, runner.vocab_size, runner.device, pending)

    def sample_deferred(self) -> None:
        """Sample the deferred step, now that the tokens it reads are recorded: it becomes
        the step in flight. While constrained or penalised rows go on, the step after it is
        scheduled first, as its masks fill, and launched behind the sampling: deferred in
        turn."""
        step, bitmask = self.deferred, self._bitmask
        if step is None:
            return
        self.deferred = self._bitmask = None
        after = self._schedule_after(step) if step.reads_outputs() else None
        self.runner.sample(step, bitmask)
        self.in_flight = step
        if after is not None:
            self._launch(after, step)
            self.deferred = after
