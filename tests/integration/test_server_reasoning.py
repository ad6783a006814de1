"""``--reasoning-parser qwen3`` on a tiny random Qwen3 with Qwen3's chat template: the
thoughts come apart from the answer, streamed and not; ``chat_template_kwargs`` switch
thinking off; a constraint and a forced tool call apply to the answer after the thinking.

The model is random, so its thoughts are whatever it samples: a seed makes each request
repeatable, and a ``logit_bias`` on ``</think>`` makes it end its thoughts soon."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from infer import EngineConfig
from infer.server import build_server, serve_in_thread
from infer.server.http.chat import ChatOptions
from infer.server.openai.reasoning import PARSERS

TEMPLATE = Path(__file__).parents[1] / "unit" / "data" / "qwen3_chat_template.jinja"
VOCAB = 320  # the tiny Qwen3's
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0-2: the config's eos is 2
TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]  # added tokens, as in Qwen3
QUESTION = [{"role": "user", "content": "Is Paris the capital of France?"}]


def qwen3_like_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE of exactly the model's vocabulary, with Qwen3's chat template."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(TAGS), special_tokens=SPECIAL, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    corpus = [TEMPLATE.read_text(), "The capital of France is Paris. Yes, no, maybe."]
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TAGS])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    hf.chat_template = TEMPLATE.read_text()
    assert len(hf) == VOCAB
    return hf


@pytest.fixture(scope="module")
def url(
    tiny_checkpoint: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    model = tmp_path_factory.mktemp("qwen3-chat") / "model"
    shutil.copytree(tiny_checkpoint("qwen3"), model)
    qwen3_like_tokenizer().save_pretrained(model)
    config = EngineConfig(model=str(model), num_gpu_blocks=64, max_seq_len=512)
    server = build_server(config, port=0, log_level="warning",
                          chat=ChatOptions(reasoning_parser=PARSERS["qwen3"]))  # fmt: skip
    with serve_in_thread(server) as base_url:
        yield base_url


def post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{url}{path}", json=body, timeout=300)
    assert response.status_code == 200, response.text
    reply: dict[str, Any] = response.json()
    return reply


def token_id(url: str, text: str) -> int:
    (only,) = post(url, "/tokenize", {"prompt": text})["tokens"]
    return int(only)


def sampled(url: str, **fields: Any) -> dict[str, Any]:
    """A seeded chat completion whose thoughts end soon, with its raw output's text."""
    body = {
        "messages": QUESTION, "temperature": 1.0, "seed": 7, "max_tokens": 48,
        "return_token_ids": True, "logit_bias": {str(token_id(url, "</think>")): 5},
        **fields,
    }  # fmt: skip
    reply = post(url, "/v1/chat/completions", body)
    choice = reply["choices"][0]
    tokens = choice["token_ids"]
    choice["raw"] = post(url, "/detokenize", {"tokens": tokens})["prompt"]
    return choice


def test_thinking_switch_reaches_the_chat_template(url: str) -> None:
    def prompt(**fields: Any) -> str:
        tokens = post(url, "/tokenize", {"messages": QUESTION, **fields})["tokens"]
        return str(post(url, "/detokenize", {"tokens": tokens})["prompt"])

    # (decoded without the special tokens: <|im_start|> is not there)
    assert prompt().endswith("France?\nassistant\n")
    off = prompt(chat_template_kwargs={"enable_thinking": False})
    assert off.endswith("France?\nassistant\n<think>\n\n</think>\n\n")


def test_thoughts_come_apart_from_the_answer(url: str) -> None:
    choice = sampled(url)
    raw, message = choice["raw"], choice["message"]
    assert "</think>" in raw  # the bias made it end its thoughts
    thoughts, _, answer = raw.removeprefix("<think>").partition("</think>")
    assert message.get("reasoning_content") == (thoughts or None)
    assert message["content"] == (answer.lstrip() or None)


def test_streamed_thoughts_and_answer_add_up_to_the_whole(url: str) -> None:
    whole = sampled(url)["message"]
    body = {
        "messages": QUESTION, "temperature": 1.0, "seed": 7, "max_tokens": 48, "stream": True,
        "logit_bias": {str(token_id(url, "</think>")): 5},
    }  # fmt: skip
    reasoning, content = "", ""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                delta = httpx.Response(200, content=line[6:]).json()["choices"][0]["delta"]
                reasoning += delta.get("reasoning_content") or ""
                content += delta.get("content") or ""
    assert (reasoning or None, content or None) == (
        whole.get("reasoning_content"),
        whole["content"],
    )


def test_with_thinking_off_everything_is_the_answer(url: str) -> None:
    choice = sampled(url, chat_template_kwargs={"enable_thinking": False}, logit_bias=None)
    assert "reasoning_content" not in choice["message"]
    assert choice["message"]["content"] == (choice["raw"] or None)


@pytest.mark.parametrize("thinking", [True, False])
def test_a_constraint_applies_to_the_answer_after_the_thoughts(url: str, thinking: bool) -> None:
    choice = sampled(
        url, guided_choice=["yes", "no"], chat_template_kwargs={"enable_thinking": thinking}
    )
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] in ("yes", "no")
    if thinking:  # free thoughts, then the answer after optional whitespace
        _, end, answer = choice["raw"].removeprefix("<think>").partition("</think>")
        assert end and answer.lstrip() == choice["message"]["content"]
    else:
        assert choice["raw"] == choice["message"]["content"]


def test_a_forced_tool_call_comes_after_the_thoughts(url: str) -> None:
    tool = {"type": "function", "function": {"name": "ping", "parameters": {
        "type": "object", "properties": {}, "additionalProperties": False}}}  # fmt: skip
    choice = sampled(url, tools=[tool], tool_choice="required")
    assert choice["finish_reason"] == "tool_calls"
    calls = choice["message"]["tool_calls"]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("ping", "{}")]
    assert "</think>" in choice["raw"]
