"""Text prompts and conversations to token ids, off the event loop and many at once.

A burst of requests (a benchmark's 256 at once) would otherwise be tokenized one by one:
each a round trip to a worker thread, each holding the GIL through the tokenizer's Python
wrapper while the event loop waits for it. Here one thread drains everything queued since
its last batch, renders the conversations' chat templates, and encodes all the texts in one
``encode_batch`` call (Rust, GIL released, on several cores), then hands every result back
to the event loop in one callback.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from dataclasses import dataclass
from typing import Any

from infer.engine.prompts import PromptEncoder
from infer.tokenizer import Message, Tokenizer


@dataclass(slots=True)
class _Item:
    text: str | None  # a plain prompt, or None for a conversation
    messages: list[Message] | None
    future: asyncio.Future[list[int]]
    tools: list[dict[str, Any]] | None = None  # a conversation's function definitions


# The most prompts encoded at once: a burst's first requests go on to the engine while the
# rest are encoded, instead of all of them waiting for the whole burst.
MAX_BATCH = 64
Outcome = tuple[asyncio.Future[list[int]], list[int] | BaseException]


class PromptBatcher:
    """Encodes prompts in a thread of its own, in batches; ``close()`` ends the thread."""

    def __init__(
        self, prompts: PromptEncoder, tokenizer: Tokenizer, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.prompts = prompts
        self.tokenizer = tokenizer
        self._loop = loop
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="infer-tokenize", daemon=True)
        self._thread.start()

    async def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a text prompt, validated (``ValueError`` naming ``prompt``)."""
        return await self._submit(_Item(text, None, self._loop.create_future()))

    async def encode_chat(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Token ids of a conversation through the chat template, validated like a prompt
        (``ValueError``; the template's own ``TemplateError`` when it rejects them)."""
        return await self._submit(_Item(None, messages, self._loop.create_future(), tools))

    async def _submit(self, item: _Item) -> list[int]:
        self._queue.put(item)
        return await item.future

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    # --- the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        stop = False
        while not stop:
            batch: list[_Item] = []
            entry = self._queue.get()
            while entry is not None:
                batch.append(entry)
                if len(batch) == MAX_BATCH:
                    break
                try:
                    entry = self._queue.get_nowait()
                except queue.Empty:
                    break
            else:
                stop = True  # close(): encode what came before it, then end
            if not batch:
                continue
            try:
                outcomes = self.encode(batch)
            except Exception as exc:  # the tokenizer itself failed: so do these requests
                outcomes = [(item.future, exc) for item in batch]
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                self._loop.call_soon_threadsafe(_deliver, outcomes)

    def encode(self, items: list[_Item]) -> list[Outcome]:
        """Each item's token ids, or the exception that rejects it."""
        outcomes: list[Outcome] = []
        prompts: list[tuple[_Item, str]] = []
        chats: list[tuple[_Item, str]] = []
        for item in items:
            if item.messages is None:
                assert item.text is not None
                prompts.append((item, item.text))
                continue
            try:
                chats.append((item, self.tokenizer.render_chat(item.messages, item.tools)))
            except Exception as exc:  # the template refused them: that request's error
                outcomes.append((item.future, exc))
        for group, special in ((prompts, True), (chats, False)):
            if not group:
                continue
            encoded = self.tokenizer.encode_batch([text for _, text in group], special)
            for (item, _), token_ids in zip(group, encoded):
                outcomes.append((item.future, self._checked(token_ids)))
        return outcomes

    def _checked(self, token_ids: list[int]) -> list[int] | BaseException:
        try:
            return self.prompts.encode_prompt(token_ids)
        except ValueError as exc:
            return exc


def _deliver(outcomes: list[Outcome]) -> None:
    for future, outcome in outcomes:
        if future.done():  # the request went away while it was encoded
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
