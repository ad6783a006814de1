"""A stand-in engine: the real engine process and pipes, but no model. Every step takes a
fixed time and gives each running sequence one token, so a server run against it measures
what the API process costs (intake, tokenisation, SSE framing) with nothing else varying.

Use ``partial(standin_engine, step_s=...)`` as ``engine_factory`` of ``create_app`` or
``build_server``. Prompts are tokenized by the model's real tokenizer in the API process.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from infer.config import EngineConfig, ModelConfig
from infer.contract.messages import EngineInfo
from infer.contract.outputs import RequestOutput
from infer.contract.prompts import Prompt
from infer.contract.sampling_params import SamplingParams
from infer.contract.speculation_stats import SpeculationStats
from infer.engine.core.wakeup import Wakeup
from infer.engine.process import ServedEngine
from infer.loader import resolve_model

TOKEN_TEXT = " tok"  # the text of every generated token
DEFAULT_STEP_S = 0.01  # about an H100's decode step for 256 sequences of a 3B model


@dataclass
class _Sequence:
    request_id: str
    prompt_len: int
    max_tokens: int
    token_ids: list[int] = field(default_factory=list)


@dataclass
class _Counters:
    preemptions: int = 0
    speculation: SpeculationStats = field(default_factory=SpeculationStats)  # it never speculates


class StandInEngine:
    """Runs up to ``max_batch_size`` sequences; a step starts at most every ``step_s``
    seconds (a device working while the host does its part) and gives every running
    sequence one token (id 0, text ``TOKEN_TEXT``) until ``max_tokens``."""

    def __init__(self, max_batch_size: int, max_seq_len: int, step_s: float) -> None:
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.step_s = step_s
        self.scheduler = _Counters()
        self.num_prompt_tokens = 0
        self.num_generated_tokens = 0
        self.num_structured_output_errors = 0  # it has no grammars
        self.stalled = False  # without grammars, whatever waits can run
        self.wakeup = Wakeup()  # never set
        self._waiting: deque[_Sequence] = deque()
        self._running: dict[str, _Sequence] = {}
        self._next_step = 0.0

    def add_request(
        self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None
    ) -> str:
        assert request_id is not None and not isinstance(prompt, str)
        params = params or SamplingParams()
        max_tokens = params.max_tokens or self.max_seq_len - len(prompt)
        self._waiting.append(_Sequence(request_id, len(prompt), max_tokens))
        return request_id

    def abort(self, request_id: str) -> bool:
        if self._running.pop(request_id, None) is not None:
            return True
        for sequence in self._waiting:
            if sequence.request_id == request_id:
                self._waiting.remove(sequence)
                return True
        return False

    def has_unfinished_requests(self) -> bool:
        return bool(self._running or self._waiting)

    def wait_to_schedule(self) -> None:
        """Nothing is in flight between its steps: ``step`` keeps the pace itself."""

    def step(self) -> list[RequestOutput]:
        while self._waiting and len(self._running) < self.max_batch_size:
            sequence = self._waiting.popleft()
            self._running[sequence.request_id] = sequence
            self.num_prompt_tokens += sequence.prompt_len
        now = time.perf_counter()
        time.sleep(max(0.0, self._next_step - now))
        self._next_step = max(now, self._next_step) + self.step_s
        outputs = []
        for sequence in list(self._running.values()):
            sequence.token_ids.append(0)
            done = len(sequence.token_ids) >= sequence.max_tokens
            if done:
                del self._running[sequence.request_id]
            outputs.append(_output(sequence, done))
        self.num_generated_tokens += len(outputs)
        return outputs

    def utilization(self) -> float:
        return len(self._running) / self.max_batch_size

    def cache_stats(self) -> dict[str, float | int | str]:
        return {"used_blocks": 0, "leaked_blocks": 0, "active_sequences": len(self._running)}

    def close(self) -> None:
        pass  # nothing outlives it

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)


def _output(sequence: _Sequence, done: bool) -> RequestOutput:
    return RequestOutput(
        request_id=sequence.request_id,
        prompt_token_ids=[0] * sequence.prompt_len if done else [],
        new_token_ids=[0],
        new_text=TOKEN_TEXT,
        token_ids=list(sequence.token_ids) if done else [],
        text=TOKEN_TEXT * len(sequence.token_ids),
        finished=done,
        finish_reason="length" if done else None,
    )


def standin_engine(
    config: EngineConfig, step_s: float = DEFAULT_STEP_S
) -> tuple[ServedEngine, EngineInfo]:
    """An ``engine_factory``: a stand-in with ``config``'s batch size, the model's tokenizer
    and limits (its configuration is read; its weights are not)."""
    source = resolve_model(config.model)
    model_config = ModelConfig.from_hf_dict(source.hf_config)
    max_seq_len = config.resolved_max_seq_len(model_config)
    tokenizer_path = config.tokenizer or source.tokenizer_path
    info = EngineInfo(
        max_seq_len=max_seq_len,
        kv_capacity_tokens=max_seq_len * config.max_batch_size,
        vocab_size=model_config.vocab_size,
        tokenizer_path=None if tokenizer_path is None else str(tokenizer_path),
        eos_token_ids=tuple(model_config.eos_token_ids),
    )
    return StandInEngine(config.max_batch_size, max_seq_len, step_s), info
