"""``usage.prompt_tokens_details.cached_tokens`` (the Responses API's
``input_tokens_details``): a prompt sent again reports its full blocks as served from the
prefix cache, in completions, chat, streamed usage and responses alike; a new one none of
its own."""

from __future__ import annotations

import uuid

import openai
import pytest

BLOCK = 16  # the engine's KV block size: only full blocks are cached
FILLER = " The quick brown fox jumps over the lazy dog while the cat sleeps on the mat." * 4


def fresh_text() -> str:
    """A prompt no other test sent (the shared server's cache holds theirs)."""
    return uuid.uuid4().hex + FILLER


def assert_cached_again(first: int, second: int, prompt_tokens: int) -> None:
    """The second time, the full blocks came from the cache (but the last token, which is
    run again for its logits), the partial last block did not; the first time, at most a
    chat template's opening that every conversation shares."""
    assert first < BLOCK * 2 and first < second
    assert prompt_tokens - BLOCK <= second < prompt_tokens


def test_completions_report_cached_prompt_tokens(client: openai.OpenAI) -> None:
    prompt = fresh_text()
    usages = [
        client.completions.create(model="smollm2-135m", prompt=prompt, max_tokens=2).usage
        for _ in range(2)
    ]
    assert usages[0] is not None and usages[1] is not None
    details = [u.prompt_tokens_details for u in usages]
    assert details[0] is not None and details[1] is not None
    assert_cached_again(details[0].cached_tokens or 0, details[1].cached_tokens or 0,
                        usages[1].prompt_tokens)  # fmt: skip


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_reports_cached_prompt_tokens(client: openai.OpenAI, stream: bool) -> None:
    messages = [{"role": "user", "content": fresh_text()}]
    cached = []
    for _ in range(2):
        if stream:
            options = {"include_usage": True}
            chunks = client.chat.completions.create(
                model="smollm2-135m", messages=messages, max_tokens=2, stream=True,
                stream_options=options,
            )  # fmt: skip
            usage = list(chunks)[-1].usage
        else:
            usage = client.chat.completions.create(
                model="smollm2-135m", messages=messages, max_tokens=2
            ).usage
        assert usage is not None and usage.prompt_tokens_details is not None
        cached.append((usage.prompt_tokens_details.cached_tokens or 0, usage.prompt_tokens))
    assert_cached_again(cached[0][0], cached[1][0], cached[1][1])


def test_responses_report_cached_input_tokens(client: openai.OpenAI) -> None:
    text = fresh_text()
    usages = [
        client.responses.create(model="smollm2-135m", input=text, max_output_tokens=16).usage
        for _ in range(2)
    ]
    assert usages[0] is not None and usages[1] is not None
    assert_cached_again(usages[0].input_tokens_details.cached_tokens,
                        usages[1].input_tokens_details.cached_tokens,
                        usages[1].input_tokens)  # fmt: skip
