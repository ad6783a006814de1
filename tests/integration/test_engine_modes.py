"""Greedy outputs are identical whatever the engine's mode: Hugging Face transformers,
contiguous, paged, chunk sizes 1/7/16/512, static vs continuous, a pool so small that
requests are preempted again and again, and n-gram speculation beside each of those that
matter to it. After every workload no block is leaked."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import FAMILIES

from infer import LLM, SamplingParams

PROMPT_LENGTHS = (5, 19, 33, 50, 12, 27, 8, 41)
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
MODES: dict[str, dict[str, Any]] = {
    "contiguous": {
        "kv_cache_backend": "contiguous",
        "use_prefix_caching": False,
        "max_batch_size": 4,
        "use_chunked_prefill": False,
    },
    "paged": {"use_chunked_prefill": False, "use_prefix_caching": False},
    "synchronous": {"use_async_scheduling": False},
    "chunk-1": {"prefill_chunk_size": 1, "long_prefill_threshold": 0},
    "chunk-7": {"prefill_chunk_size": 7, "long_prefill_threshold": 0},
    "chunk-16": {"prefill_chunk_size": 16, "long_prefill_threshold": 0},
    "chunk-512": {"prefill_chunk_size": 512},
    "chunk-7-two-per-step": {
        "prefill_chunk_size": 7,
        "max_prefill_chunks_per_step": 2,
        "long_prefill_threshold": 0,
    },
    # budget-sized chunks (4 rows, 24 tokens a step) for prompts over 30 tokens or alone
    "chunk-by-length": {
        "prefill_chunk_size": 7,
        "long_prefill_threshold": 30,
        "max_batch_size": 4,
        "max_num_batched_tokens": 24,
    },
    "static": {
        "batching_mode": "static",
        "kv_cache_backend": "contiguous",
        "use_chunked_prefill": False,
        "use_prefix_caching": False,
        "max_batch_size": 2,
    },
    "tiny-pool": {  # 80 tokens: the longest sequence (74) fits, few of them at once
        "num_gpu_blocks": 20,
        "block_size": 4,
        "max_seq_len": 80,
        "prefill_chunk_size": 16,
        "long_prefill_threshold": 0,
        "admission_reserve": 0.0,
    },
}
NGRAM = {"num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
MODES |= {
    "speculative": {"speculative_config": NGRAM},
    "speculative-contiguous": {**MODES["contiguous"], "speculative_config": NGRAM},
    "speculative-chunk-7": {**MODES["chunk-7"], "speculative_config": NGRAM},
    "speculative-tiny-pool": {**MODES["tiny-pool"], "speculative_config": NGRAM},
}


def _prompts(vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(7)
    return [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


def _generate(
    model: str, prompts: list[list[int]], options: dict[str, Any]
) -> tuple[list[list[int]], LLM]:
    settings = {"num_gpu_blocks": 128, "max_seq_len": 128, **options}
    llm = LLM(model, **settings)
    results = llm.generate(prompts, GREEDY, use_tqdm=False)
    return [r.outputs[0].token_ids for r in results], llm


def _assert_no_leaks(llm: LLM) -> None:
    pool = llm.engine.pool
    assert pool.audit_blocks() == []
    assert pool.used_blocks() == 0
    assert pool.stats().free_blocks == pool.num_blocks
    assert llm.cache_stats()["leaked_blocks"] == 0


def _hf_greedy(path: Path, prompts: list[list[int]]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    outputs = []
    for prompt in prompts:
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=GREEDY.max_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        outputs.append(out[0, len(prompt) :].tolist())
    return outputs


@pytest.fixture(scope="module")
def references(tiny_checkpoint: Callable[[str], Path]) -> dict[str, list[list[int]]]:
    return {f: _hf_greedy(tiny_checkpoint(f), _prompts(320)) for f in FAMILIES}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_mode_matches_transformers(
    family: str,
    mode: str,
    tiny_checkpoint: Callable[[str], Path],
    references: dict[str, list[list[int]]],
) -> None:
    outputs, llm = _generate(str(tiny_checkpoint(family)), _prompts(320), MODES[mode])
    assert outputs == references[family]
    _assert_no_leaks(llm)
    if mode.endswith("tiny-pool"):
        assert llm.cache_stats()["preemptions"] >= 3
    if mode.startswith("speculative"):
        assert llm.engine.scheduler.speculation.num_accepted_tokens > 0


@pytest.fixture(scope="module")
def smollm2_reference() -> list[list[int]]:
    outputs, _ = _generate("smollm2-135m", _prompts(49152), {})
    return outputs


@pytest.mark.parametrize(
    "mode",
    ["contiguous", "paged", "chunk-1", "chunk-7", "chunk-16", "static", "tiny-pool", "speculative"],
)
def test_smollm2_modes_agree(mode: str, smollm2_reference: list[list[int]]) -> None:
    outputs, llm = _generate("smollm2-135m", _prompts(49152), MODES[mode])
    assert outputs == smollm2_reference
    _assert_no_leaks(llm)


@pytest.mark.parametrize(
    ("options", "backend"),
    [
        ({"kv_cache_backend": "contiguous"}, "contiguous"),
        ({"batching_mode": "static"}, "contiguous"),
    ],
    ids=["contiguous-alone", "static-alone"],
)
def test_one_flag_modes_adapt_the_rest(
    options: dict[str, Any],
    backend: str,
    tiny_checkpoint: Callable[[str], Path],
    references: dict[str, list[list[int]]],
) -> None:
    """``LLM(model, kv_cache_backend="contiguous")`` and ``batching_mode="static"`` alone
    run (prefix caching, and for static the paged cache and chunking, follow them) and
    still match transformers."""
    outputs, llm = _generate(
        str(tiny_checkpoint("llama")), _prompts(320), {**options, "max_batch_size": 4}
    )
    assert llm.config.kv_cache_backend == backend and not llm.config.use_prefix_caching
    assert not llm.engine.pool.is_paged()
    assert outputs == references["llama"]
    _assert_no_leaks(llm)
