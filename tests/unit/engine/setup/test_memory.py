"""The context the KV cache holds: the model's whole context by default, lowered (and said)
where the cache holds less; an explicit one that does not fit names the most that does."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from infer import LLM, SamplingParams
from infer.config import EngineConfig
from infer.engine.setup.memory import fit_context


def test_a_context_the_cache_holds_is_kept() -> None:
    assert fit_context(EngineConfig(device="cpu"), 4096, 4096) == 4096


def test_the_default_context_is_lowered_to_what_the_cache_holds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="infer.engine.setup.memory"):
        assert fit_context(EngineConfig(device="cpu"), 131072, 20000) == 20000
    assert "max_seq_len: 20000" in caplog.text and "131072" in caplog.text


def test_an_explicit_context_that_does_not_fit_names_the_most_that_fits() -> None:
    config = EngineConfig(device="cpu", max_seq_len=8192)
    with pytest.raises(ValueError, match=r"^max_seq_len: 8192 tokens .* at most 4096"):
        fit_context(config, 8192, 4096)


def test_an_engine_serves_the_models_whole_context_by_default(
    tiny_checkpoint: Callable[[str], Path],
) -> None:
    path = str(tiny_checkpoint("llama"))  # max_position_embeddings 512
    assert LLM(path, num_gpu_blocks=64).engine.max_seq_len == 512
    assert LLM(path, num_gpu_blocks=8).engine.max_seq_len == 8 * 16  # what 8 blocks hold
    with pytest.raises(ValueError, match=r"^max_seq_len: 256 tokens .* at most 128"):
        LLM(path, num_gpu_blocks=8, max_seq_len=256)


def test_an_fp8_cache_holds_twice_the_blocks_of_bfloat16(
    tiny_checkpoint: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same byte budget, half the bytes per block: the pool sizing counts the cache's
    dtype, not the model's; the engine runs over it."""
    monkeypatch.setattr("infer.engine.setup.memory.CPU_KV_CACHE_BYTES", 1 << 20)
    path = str(tiny_checkpoint("llama"))
    options = {"dtype": "bfloat16", "max_seq_len": 64}
    bf16 = LLM(path, **options).engine.pool
    fp8 = LLM(path, kv_cache_dtype="fp8", **options)
    assert fp8.engine.pool.num_blocks // 2 == bf16.num_blocks  # 341 and 170 of 1 MiB
    assert fp8.engine.model.model.layers[0].self_attn.k_cache.dtype == torch.float8_e4m3fn
    result = fp8.generate([[5, 6, 7]], SamplingParams(max_tokens=4, temperature=0.0))[0]
    assert len(result.outputs[0].token_ids) == 4
    # The stats count the bytes: one a cached element (3 layers x 2 KV heads x 16 dims).
    stats, bf16_stats = fp8.cache_stats(), LLM(path, **options).cache_stats()
    assert stats["kv_cache_dtype"] == "float8_e4m3fn" and bf16_stats["kv_cache_dtype"] == "bfloat16"
    assert stats["kv_bytes_per_token"] == 2 * 3 * 2 * 16 == bf16_stats["kv_bytes_per_token"] // 2
    assert stats["kv_cache_bytes"] == 341 * 16 * 192 <= 1 << 20
    assert stats["kv_used_bytes"] == 0
