"""The messages between the API process and the engine process (``engine/process.py``).

Each is a small frozen dataclass, so both ends read fields by name and type checkers see
what travels. Per-request items are batched: one ``AddRequests``/``Abort`` carries every
request the API process queued since its previous message, and one ``StepEvents`` carries
every request's progress in a step, so a burst of 256 requests costs a few messages, not
hundreds (each message is a pickle, a pipe write and a wake-up of the other side).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infer.contract.outputs import RequestOutput, TokenLogprob
from infer.contract.sampling_params import SamplingParams
from infer.contract.speculation_stats import SpeculationStats

# What a running sequence produced in one step: (request_id, new token ids, new text,
# new logprobs). A tuple, not an object: it is built and pickled per request per step.
Progress = tuple[str, list[int], str, list[TokenLogprob]]
NewRequest = tuple[str, list[int], SamplingParams]  # (request_id, prompt token ids, params)


@dataclass(frozen=True)
class EngineInfo:
    """What the API process needs to validate requests without the engine."""

    max_seq_len: int
    kv_capacity_tokens: int  # the most tokens one sequence can hold in the pool
    vocab_size: int
    tokenizer_path: str | None
    eos_token_ids: tuple[int, ...]
    device_type: str | None = None  # where it runs: "cuda" or "cpu" (None: not said)


@dataclass(frozen=True)
class EngineSnapshot:
    """Engine counters, sent after every step (what ``/metrics`` shows)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    preemptions: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    structured_output_errors: int = 0
    speculation: SpeculationStats = field(default_factory=SpeculationStats)


# --- API process → engine process ----------------------------------------------------------
@dataclass(frozen=True)
class AddRequests:
    """Sequences to generate, in arrival order."""

    requests: list[NewRequest]


@dataclass(frozen=True)
class Abort:
    """Sequences the API process no longer wants (finished ones are ignored)."""

    request_ids: list[str]


@dataclass(frozen=True)
class Call:
    """Run the engine method ``name`` between two steps; answered by a ``CallResult``."""

    call_id: int
    name: str


@dataclass(frozen=True)
class Stop:
    """Abort everything, free the cache and end the process."""


Command = AddRequests | Abort | Call | Stop


# --- engine process → API process ----------------------------------------------------------
@dataclass(frozen=True)
class Ready:
    """The engine has loaded its model and takes commands (sent once)."""

    info: EngineInfo


@dataclass(frozen=True)
class StepEvents:
    """One step: progress of running sequences, whole outputs of finished ones, counters."""

    progress: list[Progress]
    finished: list[RequestOutput]
    snapshot: EngineSnapshot


@dataclass(frozen=True)
class CallResult:
    """The answer to ``Call`` ``call_id``: its value, or why it failed."""

    call_id: int
    value: Any
    error: str | None


@dataclass(frozen=True)
class EngineFailed:
    """The engine cannot go on (it could not start, or its loop raised); the process ends."""

    message: str


Event = Ready | StepEvents | CallResult | EngineFailed
