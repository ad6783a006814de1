"""The steps the engine has queued on the device ahead of its own bookkeeping.

With ``use_async_scheduling`` the engine launches the next step before it collects the
samples of the one in flight: the rows that sampled take their tokens on the device, so the
host's work overlaps the device's and the device never waits between steps. When a step's
sampling reads the output so far on the host (a grammar's mask, penalties), only its forward
pass is queued ahead (``Deferred``); it is sampled once the tokens it reads are collected.

Without async scheduling the pipeline holds one step at a time, launched and collected
within the same engine step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from infer.engine.core.pacing import LaunchPacer, StepShape
from infer.engine.core.request import Request
from infer.engine.core.runner import ForwardedStep, LaunchedStep, ModelRunner
from infer.engine.core.scheduler import Scheduler, SchedulerOutput, StepResult
from infer.engine.structured.bitmask import Bitmask, start_bitmask


@dataclass
class UncollectedStep:
    """A launched step whose samples the host has not collected yet."""

    scheduled: SchedulerOutput
    launched: LaunchedStep | None


@dataclass
class Deferred:
    """A step queued behind the one in flight whose sampling reads that step's tokens: its
    forward pass is queued, its sampling waits for them."""

    scheduled: SchedulerOutput
    forwarded: ForwardedStep | None


def _shape(scheduled: SchedulerOutput) -> StepShape:
    return scheduled.num_tokens, len(scheduled.chunks)


def _reads_outputs(scheduled: SchedulerOutput) -> bool:
    """Whether a step's sampling reads its requests' outputs so far on the host (a
    grammar's mask, penalties), so it must wait for the step before it."""
    return any(r.params.needs_output_tokens for r in scheduled.requests())


class Pipeline:
    """The step in flight and the one deferred behind it, carried from one engine step to
    the next; ``take`` starts an engine step with them. ``involved`` and ``failed`` belong
    to the engine step under way: the requests a failure of it concerns, and the admissions
    that failed while it scheduled."""

    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunner,
        *,
        run_ahead: bool,
        pacer: LaunchPacer | None,
        on_launch: Callable[[SchedulerOutput], None],
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.run_ahead_enabled = run_ahead
        self.pacer = pacer
        self._on_launch = on_launch  # the engine counts and watches every step it queues
        self.uncollected: UncollectedStep | None = None
        self.deferred: Deferred | None = None
        self.involved: list[Request] = []
        self.failed: list[Request] = []

    @property
    def busy(self) -> bool:
        return self.uncollected is not None or self.deferred is not None

    def take(self) -> tuple[UncollectedStep | None, Deferred | None]:
        """Start an engine step: hand over the step in flight and the one deferred behind
        it; the pipeline holds nothing until this engine step queues the next."""
        current, deferred = self.uncollected, self.deferred
        self.uncollected = self.deferred = None
        self.involved = [] if current is None else current.scheduled.requests()
        if deferred is not None:
            self.involved += deferred.scheduled.requests()
        self.failed = []
        return current, deferred

    def clear(self) -> None:
        """Forget what was queued (an engine step failed: its requests are recovered)."""
        self.uncollected = self.deferred = None

    def wait_to_schedule(self) -> None:
        """Sleep until the step in flight is about to end (``LaunchPacer``), so that the
        requests taken in meanwhile join the step queued next."""
        if self.pacer is not None and self.uncollected is not None and self.deferred is None:
            self.pacer.wait(_shape(self.uncollected.scheduled))

    # --- queueing steps -------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput | None:
        """The next step when nothing is in flight; None when there is nothing to run."""
        return self._scheduled(self.scheduler.schedule())

    def launch(
        self, scheduled: SchedulerOutput, previous: LaunchedStep | None = None
    ) -> UncollectedStep:
        """Queue a step on the device (behind ``previous``, whose samples it may read there);
        its samples stay there until collected."""
        uncollected = UncollectedStep(scheduled, self.runner.launch(scheduled, previous))
        self._on_launch(scheduled)
        return uncollected

    def run_ahead(self, current: UncollectedStep) -> Deferred | None:
        """With async scheduling, launch the step after ``current``: it becomes the step in
        flight, or, when its sampling reads the output so far, only its forward pass is
        queued and it is returned, to be sampled once ``current``'s tokens are known."""
        scheduled = self._schedule_after(current.scheduled)
        if scheduled is None:
            return None
        if _reads_outputs(scheduled):
            return self._defer(scheduled, current.launched)
        self.uncollected = self.launch(scheduled, current.launched)
        return None

    def _schedule_after(self, previous: SchedulerOutput) -> SchedulerOutput | None:
        if not self.run_ahead_enabled:
            return None
        scheduled = self.scheduler.schedule_ahead(previous)
        return None if scheduled is None else self._scheduled(scheduled)

    def _scheduled(self, scheduled: SchedulerOutput) -> SchedulerOutput | None:
        self.involved += scheduled.requests()
        self.failed += scheduled.failed
        return scheduled if scheduled.chunks else None

    def _defer(self, scheduled: SchedulerOutput, previous: LaunchedStep | None) -> Deferred:
        deferred = Deferred(scheduled, self.runner.forward(scheduled, previous))
        self._on_launch(scheduled)
        return deferred

    # --- finishing them -------------------------------------------------------------------
    def collect(self, current: UncollectedStep) -> StepResult:
        """Wait for the step's samples; a pacer also learns when the next step was queued
        and whether this one was still running then."""
        if self.pacer is None:
            return self.runner.collect(current.launched)
        self.pacer.launched()
        waited = not self.runner.is_done(current.launched)
        result = self.runner.collect(current.launched)
        queued_behind = self.uncollected is not None
        self.pacer.collected(_shape(current.scheduled), waited, queued_behind)
        return result

    def start_bitmask(
        self, deferred: Deferred | None, current: UncollectedStep, result: StepResult
    ) -> Bitmask | None:
        """Start filling the deferred step's grammar masks from the tokens just collected
        (the matchers consume them before ``update`` records them)."""
        if deferred is None or deferred.forwarded is None:
            return None
        sampled = current.scheduled.chunks_that_sample()
        pending = {
            c.request.request_id: token
            for c, token in zip(sampled, result.token_ids)
            if c.request.grammar is not None
        }
        runner = self.runner
        return start_bitmask(deferred.forwarded.requests, runner.vocab_size, runner.device, pending)

    def sample(self, deferred: Deferred, bitmask: Bitmask | None) -> None:
        """Sample the deferred step (it becomes the step in flight). While constrained or
        penalised rows go on, the step after it is scheduled first, as its masks fill, and
        its forward pass queued behind the sampling: deferred in turn."""
        after = None
        if _reads_outputs(deferred.scheduled):
            after = self._schedule_after(deferred.scheduled)
        sampled = None
        if deferred.forwarded is not None:
            sampled = self.runner.sample(deferred.forwarded, bitmask)
        self.uncollected = UncollectedStep(deferred.scheduled, sampled)
        if after is not None:
            self.deferred = self._defer(after, sampled)
