"""The errors both sides raise: the engine and the API process, which checks first."""

from __future__ import annotations


class QueueFullError(RuntimeError):
    """The waiting queue is at ``max_waiting_requests``; the caller should retry later."""


class ContextLengthError(ValueError):
    """A prompt that does not fit the model's context (with the tokens asked of it): the
    server's 400 says ``context_length_exceeded``, as OpenAI's does."""


class GrammarError(ValueError):
    """An invalid constraint. ``detail`` says why without the field's name, for callers that
    took the constraint from a field of their own (``response_format.json_schema.schema``)."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.detail = detail
