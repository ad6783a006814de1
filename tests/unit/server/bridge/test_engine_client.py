"""``EngineClient`` and its engine process, without HTTP, on a tiny random Llama: capacity,
the scheduler's full queue, aborts, timeouts, a sequence that cannot fit, and an engine
process that dies or cannot start."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from infer import EngineConfig, SamplingParams
from infer.contract.errors import QueueFullError
from infer.contract.outputs import RequestOutput
from infer.contract.prompts import PromptEncoder
from infer.server.bridge.engine_client import (
    EngineClient,
    EngineStoppedError,
    Job,
    RequestTimeoutError,
    warm_up_prompts,
)

T = TypeVar("T")
PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
LONG = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)


def tiny_config(checkpoint: Path, **overrides: Any) -> EngineConfig:
    options: dict[str, Any] = dict(
        model=str(checkpoint), device="cpu", num_gpu_blocks=16, max_seq_len=256,
        max_batch_size=2, max_waiting_requests=2,
    )  # fmt: skip
    return EngineConfig(**{**options, **overrides})


class LoopThread:
    """An event loop in a thread, so one engine process serves several tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=300)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


@pytest.fixture(scope="module")
def served(tiny_checkpoint: Callable[[str], Path]) -> Iterator[tuple[LoopThread, EngineClient]]:
    loop = LoopThread()
    engine = EngineClient(tiny_config(tiny_checkpoint("llama")))
    loop.run(engine.start())
    yield loop, engine
    loop.run(engine.stop())
    loop.close()


async def collect(job: Job) -> dict[int, RequestOutput]:
    finals = {}
    try:
        async for batch in job:
            finals.update((i, update.final) for i, update in batch if update.final is not None)
    finally:
        job.close()
    return finals


async def used_blocks_soon(engine: EngineClient) -> int:
    """Blocks in use once the engine has had a few steps to apply aborts."""
    for _ in range(200):
        used = int((await engine.call("cache_stats"))["used_blocks"])
        if used == 0:
            return 0
        await asyncio.sleep(0.01)
    return used


def test_capacity_is_batch_plus_waiting_and_the_rest_waits_in_the_engine(
    served: tuple[LoopThread, EngineClient],
) -> None:
    loop, engine = served

    async def body() -> None:
        assert engine.capacity == 4
        # Four at once: two run and two wait; the scheduler (at most 2 waiting) may refuse
        # some while the engine drains its commands, and those wait in the engine process.
        job = engine.submit("a", [([1, 2, 3], PARAMS)] * 4)
        with pytest.raises(QueueFullError):
            engine.submit("b", [([4, 5], PARAMS)])
        finals = await collect(job)
        assert sorted(finals) == [0, 1, 2, 3]
        assert {len(out.token_ids) for out in finals.values()} == {8}
        assert len({tuple(out.token_ids) for out in finals.values()}) == 1  # greedy, one prompt
        late = await collect(engine.submit("c", [([4, 5], PARAMS)]))  # capacity is back
        assert late[0].finish_reason == "length"
        assert engine.snapshot.generation_tokens >= 40

    loop.run(body())


def test_closing_a_job_aborts_its_sequences_and_frees_their_blocks(
    served: tuple[LoopThread, EngineClient],
) -> None:
    loop, engine = served

    async def body() -> None:
        job = engine.submit("a", [([1, 2, 3], LONG), ([4, 5, 6], LONG)])
        assert await job.__anext__()  # running
        job.close()
        assert await used_blocks_soon(engine) == 0
        stats = await engine.call("cache_stats")
        assert stats["leaked_blocks"] == 0 and stats["active_sequences"] == 0

    loop.run(body())


def test_a_job_starts_from_another_thread_and_one_closed_first_never_reaches_the_engine(
    served: tuple[LoopThread, EngineClient],
) -> None:
    loop, engine = served

    async def body() -> None:
        started = engine.reserve("a", 2)
        closed = engine.reserve("b", 1)
        assert engine.outstanding == 3  # counted from the reservation on
        closed.close()

        def start_both() -> None:  # as the tokenizer thread does: start, then flush
            engine.start_job(started, [([1, 2, 3], PARAMS)] * 2)
            engine.start_job(closed, [([4, 5, 6], LONG)])
            engine.flush()

        await asyncio.to_thread(start_both)
        assert started.started and not closed.started
        finals = await collect(started)
        assert sorted(finals) == [0, 1] and finals[0].finish_reason == "length"
        stats = await engine.call("cache_stats")  # after the adds: "b" would be running
        assert stats["active_sequences"] == 0 and stats["leaked_blocks"] == 0
        assert engine.outstanding == 0

    loop.run(body())


def test_timeout_raises_and_aborts(served: tuple[LoopThread, EngineClient]) -> None:
    loop, engine = served

    async def body() -> None:
        engine.request_timeout = 0.05
        try:
            with pytest.raises(RequestTimeoutError):
                await collect(engine.submit("a", [([1, 2, 3], LONG)]))
        finally:
            engine.request_timeout = None
        assert await used_blocks_soon(engine) == 0

    loop.run(body())


def test_a_sequence_the_cache_cannot_hold_fails_alone(
    served: tuple[LoopThread, EngineClient],
) -> None:
    loop, engine = served

    async def body() -> None:
        too_long = list(range(1, 301))  # the context (and the pool) hold 256 tokens
        finals = await collect(engine.submit("a", [(too_long, PARAMS), ([1, 2], PARAMS)]))
        assert finals[0].finish_reason == "error" and "max_seq_len" in (finals[0].error or "")
        assert finals[1].finish_reason == "length"
        assert engine.is_healthy

    loop.run(body())


def test_a_dead_engine_process_fails_everything_and_reports_it(
    tiny_checkpoint: Callable[[str], Path],
) -> None:
    async def body() -> None:
        engine = EngineClient(tiny_config(tiny_checkpoint("llama")))
        failures: list[str] = []
        engine.on_failure = failures.append  # the launcher stops the server
        await engine.start()
        job = engine.submit("a", [([1, 2, 3], LONG)])
        pid = engine.replicas[0].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(EngineStoppedError, match="exited"):
            await collect(job)
        assert not engine.is_healthy and engine.error
        assert failures == ["the engine process exited (exit code -9)"]
        with pytest.raises(EngineStoppedError):
            engine.submit("b", [([1, 2, 3], PARAMS)])
        with pytest.raises(EngineStoppedError):
            await engine.call("cache_stats")
        await engine.stop()

    asyncio.run(body())


def test_an_engine_that_cannot_start_says_why(tmp_path: Path) -> None:
    async def body() -> None:
        engine = EngineClient(EngineConfig(model=str(tmp_path / "missing.gguf"), device="cpu"))
        with pytest.raises(RuntimeError, match="could not start: FileNotFoundError"):
            await engine.start()
        assert not engine.is_healthy

    asyncio.run(body())


def test_the_tokenizer_and_chat_template_are_used_once_before_ready() -> None:
    calls: list[str] = []

    class Tokenizer:
        def encode_batch(self, texts: list[str]) -> list[list[int]]:
            calls.append("encode")
            return [[1] for _ in texts]

        def apply_chat_template(self, messages: Any, tools: Any) -> list[int]:
            calls.append("chat")
            raise ValueError("this tokenizer has no chat template")

    warm_up_prompts(PromptEncoder(Tokenizer(), 100, 64))  # type: ignore[arg-type]
    assert calls == ["encode", "chat"]  # the missing template is no error here
    warm_up_prompts(PromptEncoder(None, 100, 64))  # nothing to warm
