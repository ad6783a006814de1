"""The engine process's typed messages, through a real process and pipes, with the stand-in
engine: batched adds, aborts of running and waiting sequences, calls, stop."""

from __future__ import annotations

import multiprocessing
import pickle
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from multiprocessing.connection import Connection

import pytest

from infer import EngineConfig, SamplingParams
from infer.contract.messages import (
    Abort,
    AddRequests,
    Call,
    CallResult,
    EngineFailed,
    EngineInfo,
    EngineSnapshot,
    Event,
    Ready,
    StepEvents,
    Stop,
)
from infer.contract.outputs import RequestOutput, TokenLogprob
from infer.contract.pipes import PipeEnds, engine_pipes
from infer.contract.placement import ReplicaPlacement
from infer.engine.process import _ApiLink, _EngineLoop, placed_config, run_engine
from infer.engine.standin import TOKEN_TEXT, standin_engine
from infer.heap import IdleCollections

PARAMS = SamplingParams(max_tokens=4)


def test_messages_survive_the_pipe_unchanged() -> None:
    """Every message pickles to an equal one (what ``Connection.send`` does)."""
    info = EngineInfo(max_seq_len=8, kv_capacity_tokens=64, vocab_size=10,
                      tokenizer_path=None, eos_token_ids=(2,))  # fmt: skip
    output = RequestOutput("r-0", [1], [5], "x", [5], "x", True, "length")
    messages = [
        AddRequests([("r-0", [1, 2], PARAMS), ("r-1", [3], SamplingParams(n=1, seed=3))]),
        Abort(["r-0", "r-1"]),
        Call(7, "cache_stats"),
        Stop(),
        Ready(info),
        StepEvents(
            [("r-1", [4], "y", [TokenLogprob(4, -0.5, {4: -0.5})])],
            [output],
            EngineSnapshot(num_running=1, generation_tokens=2),
        ),
        CallResult(7, {"used_blocks": 0}, None),
        EngineFailed("boom"),
    ]
    for message in messages:
        assert pickle.loads(pickle.dumps(message)) == message


@contextmanager
def engine_process(api_processes: int) -> Iterator[list[PipeEnds]]:
    """A stand-in engine process (1 ms steps, two sequences at a time) and the pipe ends of
    ``api_processes`` API processes; stopped through the first."""
    api_ends, engine_ends = engine_pipes(api_processes)
    config = EngineConfig(model="smollm2-135m", device="cpu", max_batch_size=2)
    factory = partial(standin_engine, step_s=0.001)
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=run_engine, args=(config, engine_ends, factory), daemon=True)
    process.start()
    for ends in engine_ends:
        ends.close()
    for ends in api_ends:
        ready = receive(ends.events)
        assert isinstance(ready, Ready) and ready.info.vocab_size == 49152
    yield api_ends
    api_ends[0].commands.send(Stop())
    process.join(30)
    assert process.exitcode == 0


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[Connection, Connection]]:
    """One API process's (commands, events)."""
    with engine_process(1) as (ends,):
        yield ends.commands, ends.events


def receive(events: Connection, timeout: float = 60.0) -> Event:
    """The next event (failing, not hanging, when the engine process sends none)."""
    assert events.poll(timeout), "the engine process sent nothing"
    event: Event = events.recv()
    return event


def until_finished(events: Connection, request_ids: set[str]) -> dict[str, list[StepEvents]]:
    """The step events of each request, until all of ``request_ids`` have finished."""
    seen: dict[str, list[StepEvents]] = defaultdict(list)
    unfinished = set(request_ids)
    while unfinished:
        event = receive(events)
        assert isinstance(event, StepEvents)
        for request_id, *_ in event.progress:
            seen[request_id].append(event)
        for out in event.finished:
            seen[out.request_id].append(event)
            unfinished.discard(out.request_id)
    return seen


def test_one_add_message_runs_all_its_requests(engine: tuple[Connection, Connection]) -> None:
    commands, events = engine
    ids = [f"r-{i}" for i in range(5)]  # more than the batch: three wait
    commands.send(AddRequests([(request_id, [1, 2, 3], PARAMS) for request_id in ids]))
    seen = until_finished(events, set(ids))
    for request_id in ids:
        steps = seen[request_id]
        assert len(steps) == 4  # one token a step, the last one with the finished output
        final = steps[-1].finished[0]
        assert final.finish_reason == "length" and final.text == TOKEN_TEXT * 4
        progress = [p for step in steps[:-1] for p in step.progress if p[0] == request_id]
        assert [p[2] for p in progress] == [TOKEN_TEXT] * 3


def test_abort_of_running_and_waiting_sequences(engine: tuple[Connection, Connection]) -> None:
    commands, events = engine
    long = SamplingParams(max_tokens=10_000)
    commands.send(AddRequests([(f"r-{i}", [1], long) for i in range(4)] + [("s", [1], PARAMS)]))
    first = receive(events)
    while isinstance(first, StepEvents) and not first.progress:  # the counters of the add
        first = receive(events)
    assert isinstance(first, StepEvents) and {p[0] for p in first.progress} == {"r-0", "r-1"}
    commands.send(Abort(["r-0", "r-1", "r-2", "r-3"]))  # two running, two waiting
    seen = until_finished(events, {"s"})  # "s" runs once the others are gone
    assert seen["s"][-1].finished[0].finish_reason == "length"
    assert "r-2" not in seen and "r-3" not in seen  # aborted while waiting: never ran
    commands.send(Call(1, "cache_stats"))
    commands.send(Call(2, "step"))  # not callable
    results = []
    while len(results) < 2:
        event = receive(events)
        if isinstance(event, CallResult):
            results.append(event)
    assert results[0] == CallResult(1, {"used_blocks": 0, "leaked_blocks": 0,
                                        "active_sequences": 0}, None)  # fmt: skip
    assert results[1].error == "step: not an engine call"


def test_each_api_process_gets_the_events_of_its_own_requests() -> None:
    with engine_process(2) as (first, second):
        first.commands.send(AddRequests([("a", [1], PARAMS)]))
        second.commands.send(AddRequests([("b", [1], PARAMS)]))
        assert set(until_finished(first.events, {"a"})) == {"a"}
        assert set(until_finished(second.events, {"b"})) == {"b"}
        second.commands.send(Call(5, "cache_stats"))  # answered to the process that asked
        event = receive(second.events)
        while not isinstance(event, CallResult):
            event = receive(second.events)
        assert event.call_id == 5 and event.error is None


def test_an_api_worker_that_goes_away_has_its_requests_aborted() -> None:
    long = SamplingParams(max_tokens=10_000)
    with engine_process(2) as (first, second):
        second.commands.send(AddRequests([("w-0", [1], long), ("w-1", [1], long)]))
        event = receive(second.events)
        while not (isinstance(event, StepEvents) and event.progress):
            event = receive(second.events)
        second.close()  # the worker ends: its sequences no longer hold the batch
        first.commands.send(AddRequests([("a", [1], PARAMS)]))
        seen = until_finished(first.events, {"a"})
        assert seen["a"][-1].finished[0].finish_reason == "length"
        assert all(p[0] == "a" for step in seen["a"] for p in step.progress)
        first.commands.send(Call(6, "cache_stats"))
        event = receive(first.events)
        while not isinstance(event, CallResult):
            event = receive(first.events)
        assert event.value["active_sequences"] == 0  # the worker's are gone too


def test_a_call_while_requests_run_is_answered_after_the_step() -> None:
    """Between two steps the device waits for the next launch; a call waits instead, for
    the end of the step, when the device runs the step queued ahead."""
    api_ends, engine_ends = engine_pipes(1)
    config = EngineConfig(model="smollm2-135m", device="cpu", max_batch_size=2)
    engine, _ = standin_engine(config, step_s=0.001)
    api = _ApiLink(engine_ends[0])
    loop = _EngineLoop(engine, [api], IdleCollections())
    try:
        engine.add_request([1], SamplingParams(max_tokens=10_000), "r")
        loop.owners["r"] = api
        api_ends[0].commands.send(Call(3, "cache_stats"))
        assert api.commands.poll(10)
        assert loop.take_in(idle=False)
        assert not api_ends[0].events.poll(0.2)  # not answered before the step
        loop.put_out(engine.step())
        assert isinstance(receive(api_ends[0].events), StepEvents)
        answer = receive(api_ends[0].events)
        assert isinstance(answer, CallResult) and answer.call_id == 3
    finally:
        api.outbox.close()


def test_a_replica_meets_its_group_on_its_port_and_fails_without_its_gpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cpu = EngineConfig(model="smollm2-135m", device="cpu", tensor_parallel_size=2)
    placed = placed_config(cpu, ReplicaPlacement(1, 2, None, 1, 29601))
    assert placed.master_port == 29601 and placed.tensor_parallel_size == 2
    monkeypatch.setattr("infer.config._cuda_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    cuda = EngineConfig(model="smollm2-135m", device="cuda", tensor_parallel_size=2)
    with pytest.raises(ValueError, match=r"^data_parallel_size: replica 1 of 2 runs on GPUs 6,7"):
        placed_config(cuda, ReplicaPlacement(1, 2, ("6", "7"), None, 29601))
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    assert placed_config(cuda, ReplicaPlacement(1, 2, ("6", "7"), None, None)) == cuda
