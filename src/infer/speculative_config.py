"""Speculative decoding's settings, in vLLM's ``--speculative-config`` shape where it fits:
``{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": n}`` or
``{"model": DRAFT, "num_speculative_tokens": k}`` (``method`` ``"draft_model"``).

N-gram proposals come from the request's own prompt and output: the tokens that followed
the latest earlier occurrence of its last ``n`` tokens (``n`` from ``prompt_lookup_max``
down to ``prompt_lookup_min``). ``disable_by_batch_size``: with more running sequences than
this, no step speculates (a wide batch is compute-bound: checking proposals costs more than
they save). A draft model is any smaller model with the target's tokenizer; it proposes
its greedy continuation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

_FIELD = "speculative_config"
_METHODS = ("ngram", "draft_model")


@dataclass(frozen=True)
class SpeculativeConfig:
    num_speculative_tokens: int
    method: str = "ngram"
    model: str | None = None  # the draft model (method "draft_model")
    prompt_lookup_max: int = 5
    prompt_lookup_min: int = 5
    disable_by_batch_size: int | None = None

    def __post_init__(self) -> None:
        _check(self.method in _METHODS, "method", f"must be one of {list(_METHODS)}")
        _check(
            (self.model is not None) == (self.method == "draft_model"),
            "model",
            "names the draft model of method 'draft_model' (and only of it)",
        )
        _check(
            self.model is None or (isinstance(self.model, str) and bool(self.model)),
            "model",
            "must be a model name or path",
        )
        _check(
            _is_int(self.num_speculative_tokens) and self.num_speculative_tokens >= 1,
            "num_speculative_tokens",
            "must be an integer >= 1",
        )
        _check(
            _is_int(self.prompt_lookup_min) and self.prompt_lookup_min >= 1,
            "prompt_lookup_min",
            "must be an integer >= 1",
        )
        _check(
            _is_int(self.prompt_lookup_max) and self.prompt_lookup_max >= self.prompt_lookup_min,
            "prompt_lookup_max",
            "must be an integer >= prompt_lookup_min",
        )
        _check(
            self.disable_by_batch_size is None
            or (_is_int(self.disable_by_batch_size) and self.disable_by_batch_size >= 1),
            "disable_by_batch_size",
            "must be an integer >= 1 or null",
        )

    @classmethod
    def parse(cls, value: SpeculativeConfig | dict[str, Any] | str) -> SpeculativeConfig:
        """From a config, a dict or its JSON text; ``ValueError`` naming the field."""
        if isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{_FIELD}: not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError(f"{_FIELD}: must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"{_FIELD}.{unknown[0]}: not a speculative decoding setting")
        if "num_speculative_tokens" not in value:
            raise ValueError(f"{_FIELD}.num_speculative_tokens: is required")
        options = dict(value)
        if options.get("model") is not None and options.get("method") is None:
            options["method"] = "draft_model"
        # As vLLM: one bound given sets both.
        low, high = options.get("prompt_lookup_min"), options.get("prompt_lookup_max")
        if low is None and high is not None:
            options["prompt_lookup_min"] = high
        if high is None and low is not None:
            options["prompt_lookup_max"] = low
        return cls(**{k: v for k, v in options.items() if v is not None})

    def speculates_at(self, batch_size: int) -> bool:
        """Whether a batch of ``batch_size`` running sequences speculates."""
        limit = self.disable_by_batch_size
        return limit is None or batch_size <= limit


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{_FIELD}.{name}: {message}")
