"""``EngineClient`` over two engine replicas (``EngineReplica``) of a tiny random Llama, on
the CPU and without HTTP: prompts sharing a prefix go where it is cached, prompts without
one are spread evenly, and a killed replica costs only its own sequences."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.unit.server.bridge.test_engine_client import LoopThread, collect, tiny_config

from infer import SamplingParams
from infer.contract.pipes import replica_links
from infer.server.bridge.engine_client import EngineClient, EngineStoppedError, Job

SHORT = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
LONG = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
BLOCK = 16  # the engine's KV block size: a prefix of three blocks is cached by each


def two_replicas(checkpoint: Path) -> EngineClient:
    settings = tiny_config(checkpoint, num_gpu_blocks=64, max_batch_size=4)
    assert settings.block_size == BLOCK
    return EngineClient(settings, links=replica_links(2, 1)[0])


@pytest.fixture(scope="module")
def served(tiny_checkpoint: Callable[[str], Path]) -> Iterator[tuple[LoopThread, EngineClient]]:
    loop = LoopThread()
    engine = two_replicas(tiny_checkpoint("llama"))
    loop.run(engine.start())
    yield loop, engine
    loop.run(engine.stop())
    loop.close()


def prompt(prefix: int, suffix: int) -> list[int]:
    """Three blocks shared by every prompt of ``prefix``, then a block of its own."""
    return [100 + prefix] * (3 * BLOCK) + [200 + suffix] * BLOCK


def test_prompts_sharing_a_prefix_go_to_the_replica_that_caches_it(
    served: tuple[LoopThread, EngineClient],
) -> None:
    loop, engine = served

    async def body() -> dict[int, set[int]]:
        where: dict[int, set[int]] = {0: set(), 1: set()}
        for suffix in range(6):
            for prefix in (0, 1):
                job = engine.submit(f"p{prefix}-{suffix}", [(prompt(prefix, suffix), SHORT)])
                await collect(job)
                where[prefix].add(job.replicas[0])
        return where

    before = [r.routed_by_prefix for r in engine.replica_reports()]
    where = loop.run(body())
    assert where[0] in ({0}, {1}) and where[1] in ({0}, {1}) and where[0] != where[1]
    after = [r.routed_by_prefix for r in engine.replica_reports()]
    assert sum(after) - sum(before) == 10  # all but each prefix's first
    stats = loop.run(engine.call_each("cache_stats"))
    for each in stats:  # each replica prefilled its prefix once: 5 of 6 found it
        assert each["prefix_hits"] >= 5 * 3


def test_prompts_without_a_shared_prefix_are_spread_evenly(
    served: tuple[LoopThread, EngineClient],
) -> None:
    loop, engine = served

    async def body() -> list[int]:
        jobs: list[Job] = [
            engine.submit(f"m{i}", [([300 + i] * (2 * BLOCK), SHORT)]) for i in range(8)
        ]
        for job in jobs:
            await collect(job)
        return [job.replicas[0] for job in jobs]

    replicas = loop.run(body())
    assert sorted(replicas) == [0] * 4 + [1] * 4


def test_a_killed_replica_costs_only_its_own_sequences(
    tiny_checkpoint: Callable[[str], Path],
) -> None:
    async def body() -> None:
        engine = two_replicas(tiny_checkpoint("llama"))
        failures: list[str] = []
        engine.on_failure = failures.append
        await engine.start()
        jobs = [engine.submit(f"k{i}", [([400 + i] * BLOCK, LONG)]) for i in range(4)]
        assert sorted(job.replicas[0] for job in jobs) == [0, 0, 1, 1]
        pid = engine.replicas[1].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        results = await asyncio.gather(*(collect(job) for job in jobs), return_exceptions=True)
        for job, result in zip(jobs, results, strict=True):
            if job.replicas[0] == 1:
                assert isinstance(result, EngineStoppedError)
                assert "replica 1: the engine process exited" in str(result)
            else:
                assert not isinstance(result, BaseException) and result[0].finish_reason
        assert engine.is_healthy and engine.error is None and failures == []
        assert engine.capacity == 4 + 2  # one replica's batch and queue
        reports = engine.replica_reports()
        assert reports[0].error is None and "exit code -9" in str(reports[1].error)
        later = engine.submit("after", [([500] * BLOCK, SHORT)])
        assert later.replicas == [0]
        await collect(later)
        stats = await engine.call_each("cache_stats")
        assert stats[0] is not None and stats[1] is None
        with pytest.raises(EngineStoppedError, match="replica 1"):
            await engine.call("cache_stats", 1)
        # The last one failing stops the server, as a single engine's failure does.
        pid = engine.replicas[0].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        for _ in range(500):
            if failures:
                break
            await asyncio.sleep(0.01)
        assert failures and not engine.is_healthy
        await engine.stop()

    asyncio.run(body())
