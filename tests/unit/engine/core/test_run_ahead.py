"""RunAhead: what async scheduling queues on the device, and when each step is sampled."""

from __future__ import annotations

from typing import Any

import torch

from infer.contract.sampling_params import SamplingParams
from infer.engine.core.request import Request
from infer.engine.core.run_ahead import RunAhead
from infer.engine.core.step import ScheduledChunk, Step

PLAIN = SamplingParams(max_tokens=8)
PENALISED = SamplingParams(max_tokens=8, frequency_penalty=1.0)  # sampling reads its outputs


class _Device:
    """The runner and the engine's hooks, recording the order of what is queued."""

    vocab_size = 32
    device = torch.device("cpu")

    def __init__(self, *after: Step) -> None:
        self.events: list[tuple[str, int]] = []
        self.next = list(after)  # what ``schedule_after`` hands out, in turn
        self.names: dict[int, int] = {}

    def name(self, step: Step) -> int:
        return self.names.setdefault(id(step), len(self.names))

    def schedule_after(self, step: Step) -> Step | None:
        self.events.append(("schedule after", self.name(step)))
        return self.next.pop(0) if self.next else None

    def launch(self, step: Step, previous: Step) -> None:
        self.events.append(("launch", self.name(step)))
        step.rows, step.logits = step.requests(), torch.zeros(1, self.vocab_size)

    def sample(self, step: Step, bitmask: Any = None) -> None:
        self.events.append(("sample", self.name(step)))
        step.logits = None

    def is_done(self, step: Step) -> bool:
        return True

    def collect(self, step: Step) -> None:
        self.events.append(("collect", self.name(step)))
        step.token_ids = [0] * len(step.rows)


def _step(params: SamplingParams) -> Step:
    request = Request("r", [1, 2, 3], 3, params, seed=0)
    return Step(chunks=[ScheduledChunk(request, 3, 1, samples=True)])


def _ahead(device: _Device) -> RunAhead:
    return RunAhead(
        device,  # type: ignore[arg-type]
        None,
        schedule_after=device.schedule_after,
        launch=device.launch,
    )


def test_the_next_step_is_launched_and_sampled_before_this_one_is_collected() -> None:
    current, following = _step(PLAIN), _step(PLAIN)
    device = _Device(following)
    device.name(current)
    ahead = _ahead(device)
    ahead.queue_next(current)
    ahead.collect(current)
    ahead.sample_deferred()
    assert device.events == [("schedule after", 0), ("launch", 1), ("sample", 1), ("collect", 0)]
    assert ahead.in_flight is following and ahead.deferred is None
    assert ahead.take() is following and not ahead.busy


def test_a_step_that_reads_outputs_is_sampled_once_the_step_before_is_collected() -> None:
    current, penalised, after = _step(PLAIN), _step(PENALISED), _step(PENALISED)
    device = _Device(penalised, after)
    device.name(current)
    ahead = _ahead(device)
    ahead.queue_next(current)
    assert ahead.deferred is penalised and ahead.in_flight is None
    ahead.collect(current)
    ahead.sample_deferred()
    # The step after it reads its outputs too: scheduled before the sampling, launched
    # behind it, and deferred in turn.
    assert device.events == [
        ("schedule after", 0),
        ("launch", 1),
        ("collect", 0),
        ("schedule after", 1),
        ("sample", 1),
        ("launch", 2),
    ]
    assert ahead.in_flight is penalised and ahead.deferred is after
    assert ahead.queued() == [penalised, after]
    ahead.queue_next(ahead.take())  # type: ignore[arg-type]
    assert device.next == [] and ahead.deferred is after  # nothing queued past a deferred step


def test_clear_forgets_every_queued_step() -> None:
    current = _step(PLAIN)
    device = _Device(_step(PENALISED))
    ahead = _ahead(device)
    ahead.queue_next(current)
    assert ahead.busy
    ahead.clear()
    assert not ahead.busy and ahead.queued() == []
