"""``echo``, ``prompt_logprobs`` and ``max_tokens: 0`` on /v1/completions, as lm-eval's
``local-completions`` log-likelihood requests send them: the prompt's scores are checked
against the model's own logprobs of the tokens it generated, and against Hugging Face
transformers on the same GGUF weights."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import torch

CONTEXT = "Question: What is the capital of France?\nAnswer:"
# lm-eval's payload for a log-likelihood request (openai_completions.py, _create_payload)
LOGLIKELIHOOD = {"temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True}


def _complete(url: str, **body: Any) -> dict[str, Any]:
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def tokens(url: str) -> list[int]:
    """The context's token ids (as the server tokenizes it)."""
    response = httpx.post(f"{url}/tokenize", json={"prompt": CONTEXT})
    return response.json()["tokens"]


@pytest.fixture(scope="module")
def transformers_logprobs(tokens: list[int], smollm2_transformers: Any) -> torch.Tensor:
    """``[P, vocab]`` log-softmax of transformers' logits over the same GGUF file."""
    with torch.no_grad():
        logits = smollm2_transformers(torch.tensor([tokens])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def test_the_loglikelihood_request_scores_the_prompt_as_transformers_does(
    url: str, tokens: list[int], transformers_logprobs: torch.Tensor
) -> None:
    choice = _complete(url, prompt=tokens, **LOGLIKELIHOOD)["choices"][0]
    logprobs = choice["logprobs"]
    # The prompt's tokens, then the one generated: lm-eval reads [ctxlen:-1].
    assert len(logprobs["tokens"]) == len(tokens) + 1
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    expected = [transformers_logprobs[i, t].item() for i, t in enumerate(tokens[1:])]
    torch.testing.assert_close(
        torch.tensor(logprobs["token_logprobs"][1:-1]), torch.tensor(expected), atol=1e-3, rtol=0
    )
    # Each top_logprobs entry holds the prompt token and the most likely one.
    greedy = transformers_logprobs.argmax(dim=-1).tolist()
    for i, top in enumerate(logprobs["top_logprobs"][1:-1]):
        assert len(top) == 1 + (greedy[i] != tokens[i + 1])
    assert choice["text"].startswith(CONTEXT)


def test_echoed_scores_match_the_logprobs_of_the_tokens_generated(
    url: str, tokens: list[int]
) -> None:
    generated = _complete(url, prompt=tokens, max_tokens=8, temperature=0, logprobs=0,
                          return_token_ids=True)["choices"][0]  # fmt: skip
    answer = generated["token_ids"]
    echoed = _complete(url, prompt=tokens + answer, max_tokens=0, echo=True, logprobs=0)
    choice = echoed["choices"][0]
    assert choice["text"].endswith(generated["text"])
    assert echoed["usage"]["completion_tokens"] == 0
    torch.testing.assert_close(
        torch.tensor(choice["logprobs"]["token_logprobs"][len(tokens) :]),
        torch.tensor(generated["logprobs"]["token_logprobs"]),
        atol=1e-3,
        rtol=0,
    )


def test_prompt_logprobs_are_whole_when_the_prefix_is_cached(
    url: str, tokens: list[int], transformers_logprobs: torch.Tensor
) -> None:
    """The second request's prefix is in the cache; its prompt is scored all the same."""
    body = {"prompt": tokens, "max_tokens": 1, "prompt_logprobs": 2, "temperature": 0}
    first, again = (_complete(url, **body)["choices"][0] for _ in range(2))
    assert first["prompt_logprobs"] == again["prompt_logprobs"]
    scores = again["prompt_logprobs"]
    assert scores[0] is None and len(scores) == len(tokens)
    for position, entry in enumerate(scores[1:], start=1):
        token = str(tokens[position])
        assert token in entry and len(entry) in (2, 3)
        rank = int((transformers_logprobs[position - 1] > entry[token]["logprob"]).sum()) + 1
        assert abs(entry[token]["rank"] - rank) <= 1  # ties within float noise
