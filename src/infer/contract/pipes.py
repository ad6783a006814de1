"""The pipes between the API processes and the engine processes.

Each API process has a pair of its own to each engine process (one per data-parallel
replica): commands go one way, events the other. An engine process reads the commands of
all of them and sends each the events of its own requests, so API processes never talk to
each other. Pair 0 belongs to the process that started the engines; the others to the API
workers it spawned (``server/bridge/api_workers.py``).
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from multiprocessing.connection import Connection


@dataclass(frozen=True)
class PipeEnds:
    """One side's ends of an API process's two pipes: on the API side it sends on
    ``commands`` and receives on ``events``; on the engine side the other way round."""

    commands: Connection
    events: Connection

    def close(self) -> None:
        self.commands.close()
        self.events.close()


def engine_pipes(count: int) -> tuple[list[PipeEnds], list[PipeEnds]]:
    """Pipes for ``count`` API processes: (their ends, the engine's ends), index by index."""
    context = multiprocessing.get_context("spawn")
    api_ends: list[PipeEnds] = []
    engine_ends: list[PipeEnds] = []
    for _ in range(count):
        commands_read, commands_write = context.Pipe(duplex=False)
        events_read, events_write = context.Pipe(duplex=False)
        api_ends.append(PipeEnds(commands_write, events_read))
        engine_ends.append(PipeEnds(commands_read, events_write))
    return api_ends, engine_ends


@dataclass(frozen=True)
class EngineLink:
    """What an ``EngineClient`` reaches the engine through: its own ends (``api``) and, in the
    process that starts the engine, the engine's ends of every API process's pipes, its own
    first (``engine``; None in an API worker, whose engine is already running)."""

    api: PipeEnds
    engine: list[PipeEnds] | None


def single_link() -> EngineLink:
    """The link of the only API process: it starts the engine with one pair of pipes."""
    api_ends, engine_ends = engine_pipes(1)
    return EngineLink(api_ends[0], engine_ends)


def replica_links(replicas: int, api_processes: int) -> list[list[EngineLink]]:
    """Every API process's links to every replica's engine: ``[process][replica]``. The
    first process's links hold the engines' ends (it starts them)."""
    pipes = [engine_pipes(api_processes) for _ in range(replicas)]
    return [
        [EngineLink(api_ends[process], engine_ends if process == 0 else None)
         for api_ends, engine_ends in pipes]
        for process in range(api_processes)
    ]  # fmt: skip
