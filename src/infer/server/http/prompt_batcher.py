"""Text prompts and conversations to token ids, off the event loop and many at once, and
the work started from there.

A burst of requests (a benchmark's 256 at once) would otherwise be tokenized one by one:
each a round trip to a worker thread, each holding the GIL through the tokenizer's Python
wrapper while the event loop waits for it. Here one thread drains everything queued since
its last batch, renders the conversations' chat templates, and encodes all the texts in one
``encode_batch`` call (Rust, GIL released, on several cores), then hands every result back
to the event loop in one callback.

Each request may also give an ``on_encoded`` callback, which the thread runs on its checked
token ids before anything goes back to the event loop: the server sends the request to the
engine from there. During a burst the event loop is busy parsing the requests that are still
arriving; a request whose submission waited for the loop to come back to it reached the
engine only after most of the burst had been parsed.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from infer.contract.prompts import Prompt, PromptEncoder
from infer.tokenizer import DEFAULT_TEMPLATE_ARGS, ChatTemplateArgs, Message, Tokenizer

# Runs on a request's token ids (one list per prompt) where they were encoded; what it
# raises is that request's error.
OnEncoded = Callable[[list[list[int]]], None]


@dataclass(frozen=True, slots=True)
class PromptOptions:
    """How a request's prompts become token ids besides their text (vLLM's parameters)."""

    add_special_tokens: bool = True  # a conversation's template has put its own in
    keep_last: int | None = None  # keep only the prompt's last tokens (None: all)
    template: ChatTemplateArgs = DEFAULT_TEMPLATE_ARGS  # how a conversation is rendered


PLAIN = PromptOptions()
CHAT = PromptOptions(add_special_tokens=False)


@dataclass(slots=True)
class _Item:
    prompts: Sequence[Prompt] | None  # plain prompts (text or token ids), or None for a chat
    messages: list[Message] | None
    tools: list[dict[str, Any]] | None  # a conversation's function definitions
    options: PromptOptions
    on_encoded: OnEncoded | None
    future: asyncio.Future[list[list[int]]]


# The most requests encoded at once: a burst's first requests go on to the engine while the
# rest are encoded, instead of all of them waiting for the whole burst.
MAX_BATCH = 64
Outcome = tuple[asyncio.Future[list[list[int]]], list[list[int]] | BaseException]


class PromptBatcher:
    """Encodes prompts in a thread of its own, in batches; ``close()`` ends the thread."""

    def __init__(
        self,
        prompts: PromptEncoder,
        tokenizer: Tokenizer,
        loop: asyncio.AbstractEventLoop,
        after_batch: Callable[[], None] | None = None,
    ) -> None:
        """``after_batch`` runs in the thread once a batch's ``on_encoded`` callbacks ran
        (the server sends the requests they started in one message)."""
        self.prompts = prompts
        self.tokenizer = tokenizer
        self._loop = loop
        self._after_batch = after_batch
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="infer-tokenize", daemon=True)
        self._thread.start()

    async def encode_prompts(
        self,
        prompts: Sequence[Prompt],
        on_encoded: OnEncoded | None = None,
        options: PromptOptions = PLAIN,
    ) -> list[list[int]]:
        """Token ids of each prompt (text is tokenized, ids only checked), validated
        (``ValueError`` naming ``prompt``)."""
        item = _Item(prompts, None, None, options, on_encoded, self._future())
        return await self._submit(item)

    async def encode_chat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        on_encoded: OnEncoded | None = None,
        options: PromptOptions = CHAT,
    ) -> list[list[int]]:
        """The token ids of a conversation through the chat template (one prompt), validated
        (``ValueError`` naming ``messages``; the template's own ``TemplateError`` when it
        rejects them)."""
        item = _Item(None, messages, tools, options, on_encoded, self._future())
        return await self._submit(item)

    def _future(self) -> asyncio.Future[list[list[int]]]:
        return self._loop.create_future()

    async def _submit(self, item: _Item) -> list[list[int]]:
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
            if self._after_batch is not None:
                self._after_batch()
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                self._loop.call_soon_threadsafe(_deliver, outcomes)

    def encode(self, items: list[_Item]) -> list[Outcome]:
        """Each item's token ids (after its ``on_encoded`` ran), or the exception that
        rejects it."""
        # (index of the item, its text), by whether special tokens are added to it
        texts: dict[bool, list[tuple[int, str]]] = {True: [], False: []}
        failed: dict[int, BaseException] = {}
        for index, item in enumerate(items):
            group = texts[item.options.add_special_tokens]
            try:
                if item.prompts is not None:
                    strings = [p for p in item.prompts if isinstance(p, str)]
                    field = "prompt"
                else:
                    assert item.messages is not None
                    template = item.options.template
                    strings = [self.tokenizer.render_chat(item.messages, item.tools, template)]
                    field = "messages"
                if item.options.keep_last is None:  # hopeless ones are never tokenized
                    for text in strings:
                        self.prompts.check_text_length(text, field)
            except Exception as exc:  # the template refused them, or too long: its error
                failed[index] = exc
                continue
            group += ((index, text) for text in strings)
        encoded: dict[int, list[list[int]]] = {}  # each item's texts' ids, in order
        for special, group in texts.items():
            if group:
                ids = self.tokenizer.encode_batch([text for _, text in group], special)
                for (index, _), token_ids in zip(group, ids):
                    encoded.setdefault(index, []).append(token_ids)
        outcomes: list[Outcome] = []
        for index, item in enumerate(items):
            refused = failed.get(index)
            if refused is None:
                outcomes.append((item.future, self._finish(item, encoded.get(index, []))))
            else:
                outcomes.append((item.future, refused))
        return outcomes

    def _finish(self, item: _Item, encoded: list[list[int]]) -> list[list[int]] | BaseException:
        """Check the item's prompts (``encoded``: its texts' ids, in order) and run its
        ``on_encoded``."""
        keep_last = item.options.keep_last
        try:
            if item.prompts is None:
                prompts = [self.prompts.encode_prompt(encoded[0], "messages", keep_last)]
            else:
                texts = iter(encoded)
                prompts = [
                    self.prompts.encode_prompt(
                        next(texts) if isinstance(p, str) else p, keep_last=keep_last
                    )
                    for p in item.prompts
                ]
            if item.on_encoded is not None:
                item.on_encoded(prompts)
        except Exception as exc:
            return exc
        return prompts


def _deliver(outcomes: list[Outcome]) -> None:
    for future, outcome in outcomes:
        if future.done():  # the request went away while it was encoded
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
