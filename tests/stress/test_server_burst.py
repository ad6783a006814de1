"""A burst of streamed text requests, all at once, as a benchmark client sends them, against
the stand-in engine (``infer.engine.standin``: no model, a fixed step time): every stream
comes back whole through the official ``openai`` client, prompts are tokenized as one at a
time would be, and requests that arrive together reach the engine together."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from functools import partial

import openai
import pytest

from infer import EngineConfig
from infer.engine.standin import TOKEN_TEXT, standin_engine
from infer.server import build_server, serve_in_thread
from infer.server.bridge.engine_client import EngineClient
from infer.tokenizer import Tokenizer

BURST = 64
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def added() -> Iterator[list[int]]:
    """How many sequences each message to the engine added (``EngineClient.flush``)."""
    sizes: list[int] = []
    flush = EngineClient.flush

    def counting(engine: EngineClient) -> None:
        queued = sum(len(replica.adds) for replica in engine.replicas)
        if queued:
            sizes.append(queued)
        flush(engine)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EngineClient, "flush", counting)
        yield sizes


@pytest.fixture(scope="module")
def served(added: list[int]) -> Iterator[tuple[str, EngineClient]]:
    config = EngineConfig(model="smollm2-135m", device="cpu", max_batch_size=BURST)
    factory = partial(standin_engine, step_s=0.002)
    server = build_server(config, port=0, log_level="warning", engine_factory=factory)
    with serve_in_thread(server) as base_url:
        yield base_url, server.engine


def prompts(tokenizer: Tokenizer) -> list[str]:
    rng = random.Random(0)
    return [
        tokenizer.decode([rng.randrange(1000, 40000) for _ in range(rng.randint(100, 300))])
        for _ in range(BURST)
    ]


def test_a_burst_of_streamed_completions(
    served: tuple[str, EngineClient], added: list[int]
) -> None:
    url, engine = served
    tokenizer = engine.prompts.tokenizer
    assert tokenizer is not None
    texts = prompts(tokenizer)
    added.clear()

    async def stream(client: openai.AsyncOpenAI, prompt: str) -> tuple[str, int, int]:
        chunks = await client.completions.create(
            model="smollm2-135m", prompt=prompt, max_tokens=MAX_TOKENS, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        text, usage = "", None
        async for chunk in chunks:
            text += "".join(choice.text for choice in chunk.choices)
            usage = chunk.usage or usage
        assert usage is not None
        return text, usage.prompt_tokens, usage.completion_tokens

    async def run() -> list[tuple[str, int, int]]:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        async with client:
            return await asyncio.gather(*(stream(client, prompt) for prompt in texts))

    answers = asyncio.run(run())
    for prompt, (text, prompt_tokens, completion_tokens) in zip(texts, answers):
        assert text == TOKEN_TEXT * MAX_TOKENS and completion_tokens == MAX_TOKENS
        assert prompt_tokens == len(tokenizer.encode(prompt))
    assert sum(added) == BURST
    assert len(added) < BURST  # some arrived together: fewer messages than requests


def test_a_burst_of_streamed_chats(served: tuple[str, EngineClient]) -> None:
    url, engine = served
    tokenizer = engine.prompts.tokenizer
    assert tokenizer is not None
    texts = prompts(tokenizer)

    async def stream(client: openai.AsyncOpenAI, prompt: str) -> tuple[str, int]:
        messages = [{"role": "user", "content": prompt}]
        chunks = await client.chat.completions.create(
            model="smollm2-135m", messages=messages,  # type: ignore[arg-type]
            max_tokens=MAX_TOKENS, stream=True, stream_options={"include_usage": True},
        )  # fmt: skip
        text, usage = "", None
        roles = set()
        async for chunk in chunks:
            for choice in chunk.choices:
                text += choice.delta.content or ""
                roles.add(choice.delta.role)
            usage = chunk.usage or usage
        assert usage is not None and roles == {"assistant", None}
        expected = len(tokenizer.apply_chat_template(messages))
        assert usage.prompt_tokens == expected
        return text, usage.completion_tokens

    async def run() -> list[tuple[str, int]]:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        async with client:
            return await asyncio.gather(*(stream(client, prompt) for prompt in texts))

    for text, completion_tokens in asyncio.run(run()):
        assert text == TOKEN_TEXT * MAX_TOKENS and completion_tokens == MAX_TOKENS
