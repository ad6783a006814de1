"""Reasoning parsers (``infer serve --reasoning-parser``): a thinking model's thoughts apart
from its answer, as vLLM and SGLang return them (``reasoning_content`` beside ``content``).

Qwen3 and the models distilled from DeepSeek-R1 think in ``<think>…</think>`` before they
answer. Qwen3 opens the block itself unless the request switches thinking off
(``chat_template_kwargs: {"enable_thinking": false}``: its template then writes an empty
block into the prompt); DeepSeek-R1's template opens it in the prompt, so the output starts
inside it. Either way, with thinking on:

- a leading ``<think>`` in the output is dropped; what comes before ``</think>`` is the
  reasoning, what comes after it the answer (``content``) without the whitespace that
  separates them (Qwen3 writes a blank line; a constraint's grammar allows any); output
  that never closes the block (cut by ``max_tokens``) is all reasoning;
- with thinking off, the whole output is the answer.

Streamed and whole responses split alike: the whole text goes through the same stream
(``ReasoningStream``). Tool calls and structured outputs apply to the answer: the tool-call
parser reads only the content, and a constraint's grammar lets the model think freely first
(``ReasoningParser.after_thinking``, llguidance's own recipe for reasoning models).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from infer.contract.sampling_params import StructuredOutputsParams
from infer.server.openai.tool_calls import partial_tag

THINK_START = "<think>"
THINK_END = "</think>"


@dataclass(frozen=True)
class ReasoningParser:
    """How one family of models writes its thinking. ``switch``: the chat template variable
    that turns thinking off when false (None: the model always thinks)."""

    switch: str | None

    def thinks(self, template_kwargs: dict[str, Any]) -> bool:
        """Whether the model thinks before answering this request."""
        return self.switch is None or template_kwargs.get(self.switch, True) is not False

    def after_thinking(
        self, answer: StructuredOutputsParams, tags_are_tokens: bool
    ) -> StructuredOutputsParams:
        """``answer``'s constraint behind a free ``<think>…</think>`` block, its opener
        optional (the prompt may have written it), as llguidance's documentation writes
        it for reasoning models. ``tags_are_tokens``: the tags are tokens of their own
        (Qwen3's, DeepSeek-R1's), which llguidance matches only as such."""
        return answer.behind(THINK_TOKENS if tags_are_tokens else THINK_TEXT)


# The thoughts, then whitespace (Qwen3 writes a blank line), then the answer's grammar:
# with the tags as tokens, no text can match them, so free text stops at </think>; with the
# tags as text, a lazy lexeme stops at the first "</think>".
_SPACE = r"/[ \t\r\n]+/?"
THINK_TOKENS = f"start: {THINK_START}? /(?s:.*)/ {THINK_END} {_SPACE} @answer\n"
THINK_TEXT = (
    f"start: {json.dumps(THINK_START)}? thoughts {_SPACE} @answer\n"
    f"thoughts[suffix={json.dumps(THINK_END)}]: /(?s:.*)/\n"
)


@dataclass
class Reasoning:
    """A chat request's reasoning: each choice's output split as it streams."""

    thinking: bool  # whether the model thinks before answering this request
    _streams: dict[int, ReasoningStream] = field(default_factory=dict)

    def delta(self, index: int, text: str, finished: bool) -> tuple[str, str]:
        """Choice ``index``'s new ``(reasoning, content)`` text (what was held back too,
        once it has finished)."""
        stream = self._streams.setdefault(index, ReasoningStream(self.thinking))
        return stream.whole(text) if finished else stream.add(text)

    def split(self, text: str) -> tuple[str | None, str | None]:
        """A whole output's ``(reasoning_content, content)``, each None when empty: the
        same split as the streamed one."""
        reasoning, content = ReasoningStream(self.thinking).whole(text)
        return reasoning or None, content or None


PARSERS = {
    "qwen3": ReasoningParser(switch="enable_thinking"),
    "deepseek_r1": ReasoningParser(switch=None),
}


def reasoning_parser(name: str | None) -> ReasoningParser | None:
    """The parser ``--reasoning-parser`` names (None: none)."""
    if name is None:
        return None
    if name not in PARSERS:
        raise SystemExit(f"--reasoning-parser: one of {', '.join(sorted(PARSERS))}, got {name!r}")
    return PARSERS[name]


class ReasoningStream:
    """One choice's output, split as it streams: ``add`` returns the new
    ``(reasoning, content)`` text, holding back what may still be the start of a tag."""

    def __init__(self, thinking: bool) -> None:
        self._state = "opening" if thinking else "answer"
        self._held = ""  # text not yet given out

    def add(self, text: str) -> tuple[str, str]:
        self._held += text
        reasoning = ""
        if self._state == "opening":  # a leading <think> (after whitespace) is dropped
            lead = self._held.lstrip()
            if THINK_START.startswith(lead) and len(lead) < len(THINK_START):
                return "", ""  # may still become <think>
            if lead.startswith(THINK_START):
                self._held = lead[len(THINK_START) :]
            self._state = "thinking"
        if self._state == "thinking":
            end = self._held.find(THINK_END)
            if end < 0:
                cut = len(self._held) - partial_tag(self._held, THINK_END)
                reasoning, self._held = self._held[:cut], self._held[cut:]
                return reasoning, ""
            reasoning = self._held[:end]
            self._held = self._held[end + len(THINK_END) :]
            self._state = "separator"
        if self._state == "separator":  # the whitespace between thoughts and answer
            self._held = self._held.lstrip()
            if not self._held:
                return reasoning, ""
            self._state = "answer"
        content, self._held = self._held, ""
        return reasoning, content

    def whole(self, text: str) -> tuple[str, str]:
        """``add`` the output's last text, then ``finish``."""
        reasoning, content = self.add(text)
        more_reasoning, more_content = self.finish()
        return reasoning + more_reasoning, content + more_content

    def finish(self) -> tuple[str, str]:
        """What was held back, once the output has ended: unfinished thoughts are
        reasoning."""
        held, self._held = self._held, ""
        return (held, "") if self._state in ("opening", "thinking") else ("", held)
