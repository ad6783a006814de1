"""``PromptBatcher``: batched tokenisation gives the ids one-by-one encoding gives, requests
queued while a batch is encoded go together in the next ones (``MAX_BATCH`` at a time), one
bad prompt or conversation fails alone, and a request's ``on_encoded`` runs in the thread on
its checked ids."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from jinja2 import TemplateError
from tests.conftest import MIXED_SCRIPT_TEXTS

from infer.contract.errors import ContextLengthError
from infer.contract.prompts import PromptEncoder
from infer.loader.presets import embedded_model_path
from infer.server.http.prompt_batcher import MAX_BATCH, PromptBatcher, PromptOptions
from infer.tokenizer import DEFAULT_TEMPLATE_ARGS, ChatTemplateArgs, Message, Tokenizer

TEXTS = [
    *MIXED_SCRIPT_TEXTS,
    "<|im_start|>user special tokens in text<|im_end|>",
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    loaded = Tokenizer.load(embedded_model_path())
    assert loaded is not None
    return loaded


def random_texts(tokenizer: Tokenizer, count: int) -> list[str]:
    rng = random.Random(0)
    return [
        tokenizer.decode([rng.randrange(tokenizer.vocab_size) for _ in range(rng.randint(1, 300))])
        for _ in range(count)
    ]


def test_encode_batch_equals_encode(tokenizer: Tokenizer) -> None:
    texts = TEXTS + random_texts(tokenizer, 64)
    assert tokenizer.encode_batch(texts) == [tokenizer.encode(text) for text in texts]
    chats = [tokenizer.render_chat([{"role": "user", "content": text}]) for text in texts]
    assert tokenizer.encode_batch(chats, add_special_tokens=False) == [
        tokenizer.apply_chat_template([{"role": "user", "content": text}]) for text in texts
    ]


class Gate:
    """Holds the batcher's first ``encode_batch`` call until released, counting the texts
    of every call."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls: list[int] = []

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        self.calls.append(len(texts))
        self.entered.set()
        self.release.wait(30)
        return self.tokenizer.encode_batch(texts, add_special_tokens)

    def render_chat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        args: ChatTemplateArgs = DEFAULT_TEMPLATE_ARGS,
    ) -> str:
        return self.tokenizer.render_chat(messages, tools, args)


@pytest.fixture
def gated(tokenizer: Tokenizer) -> Iterator[tuple[Any, Gate]]:
    """A batcher on its own event loop whose tokenizer waits at a gate."""
    loop = asyncio.new_event_loop()
    gate = Gate(tokenizer)
    prompts = PromptEncoder(tokenizer, tokenizer.vocab_size, max_seq_len=512)
    batcher = PromptBatcher(prompts, gate, loop)  # type: ignore[arg-type]
    yield loop, batcher, gate
    gate.release.set()
    batcher.close()
    loop.close()


def test_requests_queued_during_a_batch_are_encoded_together(
    gated: tuple[asyncio.AbstractEventLoop, PromptBatcher, Gate], tokenizer: Tokenizer
) -> None:
    loop, batcher, gate = gated
    texts = TEXTS * 12  # more than a batch holds
    conversation = [{"role": "user", "content": "What is the capital of France?"}]

    async def body() -> tuple[list[list[int]], list[list[list[int]]], list[list[int]]]:
        first = asyncio.ensure_future(batcher.encode_prompts(["first"]))
        await asyncio.to_thread(gate.entered.wait, 30)  # the thread holds "first" alone
        rest = [asyncio.ensure_future(batcher.encode_prompts([text])) for text in texts]
        chat = asyncio.ensure_future(batcher.encode_chat(conversation))
        await asyncio.sleep(0.05)  # all of them queued; none can be encoded yet
        gate.release.set()
        return await first, list(await asyncio.gather(*rest)), await chat

    first, rest, chat = loop.run_until_complete(body())
    assert first == [tokenizer.encode("first")]
    assert rest == [[tokenizer.encode(text)] for text in texts]
    assert chat == [tokenizer.apply_chat_template(conversation)]
    # One call for "first", one for as many prompts as a batch holds, then one for the
    # other prompts and one for the conversation (queued last: in the last batch).
    assert gate.calls == [1, MAX_BATCH, len(texts) - MAX_BATCH, 1]


def test_a_bad_request_fails_alone(
    gated: tuple[asyncio.AbstractEventLoop, PromptBatcher, Gate], tokenizer: Tokenizer
) -> None:
    loop, batcher, gate = gated
    gate.release.set()
    bad_template = [{"role": "user", "content": "hi"}, {"role": "user"}]  # no content
    too_long = "word " * 1000  # over max_seq_len=512

    async def body() -> list[Any]:
        futures = [
            batcher.encode_prompts(["fine"]),
            batcher.encode_prompts([""]),  # empty: no tokens (SmolLM2 adds no BOS)
            batcher.encode_prompts(["fine", too_long]),
            batcher.encode_chat(bad_template),
            batcher.encode_chat([{"role": "user", "content": "fine"}]),
        ]
        return list(await asyncio.gather(*futures, return_exceptions=True))

    fine, empty, long, template, chat = loop.run_until_complete(body())
    assert fine == [tokenizer.encode("fine")]
    assert isinstance(empty, ValueError) and str(empty) == "prompt: must not be empty"
    assert isinstance(long, ValueError) and "max_seq_len=512" in str(long)
    assert isinstance(template, TemplateError)
    assert chat == [tokenizer.apply_chat_template([{"role": "user", "content": "fine"}])]


def test_prompts_keep_their_order_and_ids_are_only_checked(
    gated: tuple[asyncio.AbstractEventLoop, PromptBatcher, Gate], tokenizer: Tokenizer
) -> None:
    loop, batcher, gate = gated
    gate.release.set()
    mixed = ["first text", [5, 6, 7], "second text"]

    async def body() -> list[Any]:
        futures = [batcher.encode_prompts(mixed), batcher.encode_prompts(["ok", [10**9]])]
        return list(await asyncio.gather(*futures, return_exceptions=True))

    encoded, out_of_vocabulary = loop.run_until_complete(body())
    assert encoded == [tokenizer.encode("first text"), [5, 6, 7], tokenizer.encode("second text")]
    assert isinstance(out_of_vocabulary, ValueError)
    assert str(out_of_vocabulary).startswith("prompt: token ids must be in")


def test_on_encoded_runs_in_the_thread_before_the_loop_hears_and_its_error_is_the_requests(
    gated: tuple[asyncio.AbstractEventLoop, PromptBatcher, Gate], tokenizer: Tokenizer
) -> None:
    loop, batcher, gate = gated
    gate.release.set()
    seen: list[tuple[str, list[list[int]]]] = []

    def record(prompts: list[list[int]]) -> None:
        seen.append((threading.current_thread().name, prompts))

    def refuse(prompts: list[list[int]]) -> None:
        raise ValueError("max_tokens: too many")

    async def body() -> list[Any]:
        futures = [
            batcher.encode_prompts(["fine"], record),
            batcher.encode_chat([{"role": "user", "content": "hi"}], None, record),
            batcher.encode_prompts(["refused"], refuse),
            batcher.encode_prompts([""], record),  # invalid: ``on_encoded`` never runs
        ]
        return list(await asyncio.gather(*futures, return_exceptions=True))

    fine, chat, refused, empty = loop.run_until_complete(body())
    assert seen == [("infer-tokenize", fine), ("infer-tokenize", chat)]
    assert isinstance(refused, ValueError) and str(refused) == "max_tokens: too many"
    assert isinstance(empty, ValueError)


def test_a_text_too_long_for_any_tokenization_is_refused_without_tokenizing(
    gated: tuple[asyncio.AbstractEventLoop, PromptBatcher, Gate], tokenizer: Tokenizer
) -> None:
    """512 tokens of at most ``max_token_chars`` characters each: a longer text cannot fit,
    so it is never tokenized (a 7 MB prompt took seconds of every core); cut to its last
    tokens (``keep_last``) it is encoded as usual."""
    loop, batcher, gate = gated
    gate.release.set()
    hopeless = "a" * (512 * tokenizer.max_token_chars + 1)
    conversation = [{"role": "user", "content": hopeless}]

    async def body() -> list[Any]:
        futures = [
            batcher.encode_prompts(["fine", hopeless]),
            batcher.encode_chat(conversation),
            batcher.encode_prompts([hopeless], options=PromptOptions(keep_last=10)),
        ]
        return list(await asyncio.gather(*futures, return_exceptions=True))

    prompt, chat, kept = loop.run_until_complete(body())
    for refused, field in ((prompt, "prompt"), (chat, "messages")):
        assert isinstance(refused, ContextLengthError)
        assert str(refused).startswith(f"{field}: ")
        assert "characters are more than max_seq_len=512 tokens can hold" in str(refused)
    assert kept == [tokenizer.encode(hopeless)[-10:]]
    assert gate.calls == [1]  # "fine" (its request failed), then the kept one alone
