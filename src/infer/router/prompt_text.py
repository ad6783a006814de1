"""What a request is routed by: the text of its prompt, as the client sent it.

The router tokenizes nothing (it has no model), so affinity is by characters: the prompt of
a completion, or the roles and texts of a conversation's messages in order (tools first, as
templates put them near the top). A completion sent as token ids is routed by its ids.
Several prompts in one request are routed by the first. A body that is not what the
endpoint expects gives an empty key (routed by load alone), and the worker answers the error.
"""

from __future__ import annotations

import json
from typing import Any

from infer.routing import RoutingKey


def routing_key(path: str, body: Any) -> RoutingKey:
    """The key of a request to ``path`` (``/v1/completions``, ``/v1/chat/completions``,
    ``/v1/responses``) with the parsed JSON ``body``."""
    if not isinstance(body, dict):
        return ""
    if path == "/v1/completions":
        return _completion_prompt(body.get("prompt"))
    if path == "/v1/chat/completions":
        return _tools(body.get("tools")) + _messages(body.get("messages"))
    if path == "/v1/responses":
        instructions = body.get("instructions")
        head = f"system\n{instructions}\n" if isinstance(instructions, str) else ""
        items = body.get("input")
        rest = f"user\n{items}\n" if isinstance(items, str) else _messages(items)
        return _tools(body.get("tools")) + head + rest
    return ""


def _completion_prompt(prompt: Any) -> RoutingKey:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch: its first prompt
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(type(t) is int for t in prompt):
        return prompt
    return ""


def _messages(messages: Any) -> str:
    if not isinstance(messages, list):
        return ""
    parts = []
    for message in messages:
        if isinstance(message, dict):
            parts.append(f"{message.get('role', '')}\n{_content(message.get('content'))}\n")
    return "".join(parts)


def _content(content: Any) -> str:
    """A message's text: a string, or the texts of its parts (images and the like skipped)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _tools(tools: Any) -> str:
    if not tools:
        return ""
    return "tools\n" + json.dumps(tools, sort_keys=True, separators=(",", ":")) + "\n"
