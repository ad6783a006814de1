"""On a GPU, in bf16: the Triton backend generates what the torch backend generates, CUDA
graphs change nothing, and every engine mode agrees, for all three families."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from infer import LLM, SamplingParams
from infer.attention import ScheduledSequence, build_metadata

pytestmark = pytest.mark.gpu

# Small but realistic shapes: head dims 128/64/256, GQA 4/4/4, a Gemma window below the prompt.
CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {
        "model_type": "llama",
        "vocab_size": 4096,
        "hidden_size": 1024,
        "intermediate_size": 2048,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
    },
    "qwen3": {
        "model_type": "qwen3",
        "vocab_size": 4096,
        "hidden_size": 1024,
        "intermediate_size": 2048,
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
    },
    "gemma3": {
        "model_type": "gemma3_text",
        "vocab_size": 4096,
        "hidden_size": 1024,
        "intermediate_size": 2048,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "sliding_window": 64,
        "sliding_window_pattern": 2,
        "query_pre_attn_scalar": 256,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
    },
}
PROMPT_LENGTHS = (7, 100, 300, 33)
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    paths = {}
    for family, config in CONFIGS.items():
        directory = tmp_path_factory.mktemp(family)
        (directory / "config.json").write_text(json.dumps(config))
        paths[family] = str(directory)
    return paths


@contextmanager
def _torch_attention() -> Iterator[None]:
    os.environ["INFER_DISABLE_TRITON"] = "1"
    try:
        yield
    finally:
        del os.environ["INFER_DISABLE_TRITON"]


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(10, 4096, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


ENGINE_SETTINGS: dict[str, Any] = {
    "load_format": "dummy",
    "device": "cuda",
    "dtype": "bfloat16",
    "num_gpu_blocks": 512,
    "max_seq_len": 1024,
    "max_batch_size": 16,
}


def _generate(path: str, sharpen: bool = True, **options: Any) -> list[list[int]]:
    llm = LLM(path, **{**ENGINE_SETTINGS, **options})
    try:
        if sharpen:  # so bf16 rounding cannot flip the random model's near-ties
            with torch.no_grad():
                llm.engine.model.lm_head.weight.mul_(8.0)
        results = llm.generate(_prompts(), GREEDY, use_tqdm=False)
        pool = llm.engine.pool
        assert pool.audit_blocks() == [] and pool.used_blocks() == 0
        return [r.outputs[0].token_ids for r in results]
    finally:
        llm.engine.close()  # a tensor-parallel engine's workers go with it


@pytest.mark.parametrize("family", CONFIGS)
def test_triton_backend_generates_what_the_torch_backend_generates(
    family: str, checkpoints: dict[str, str]
) -> None:
    triton = _generate(checkpoints[family], use_cuda_graphs=False)
    with _torch_attention():
        reference = _generate(checkpoints[family], use_cuda_graphs=False)
    assert triton == reference


@pytest.mark.parametrize("family", CONFIGS)
def test_cuda_graphs_and_engine_modes_change_nothing(
    family: str, checkpoints: dict[str, str]
) -> None:
    path = checkpoints[family]
    eager = _generate(
        path, use_cuda_graphs=False, use_chunked_prefill=False, use_prefix_caching=False
    )
    assert _generate(path) == eager  # defaults: graphs, chunked prefill, prefix caching
    assert _generate(path, prefill_chunk_size=16, max_prefill_chunks_per_step=2) == eager
    assert _generate(path, prefill_chunk_size=16, long_prefill_threshold=0) == eager
    preempting = {"num_gpu_blocks": 40, "max_seq_len": 640, "admission_reserve": 0.0}
    assert _generate(path, **preempting) == eager  # preemption
    assert (
        _generate(
            path,
            kv_cache_backend="contiguous",
            use_prefix_caching=False,
            use_chunked_prefill=False,
            use_cuda_graphs=False,
        )
        == eager
    )


@pytest.mark.parametrize("family", CONFIGS)
def test_speculation_changes_nothing(family: str, checkpoints: dict[str, str]) -> None:
    """N-gram and draft-model proposals checked in graphed verification steps (the draft is
    the same dummy checkpoint, so it mostly agrees)."""
    path = checkpoints[family]
    plain = _generate(path)
    ngram = {"num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    assert _generate(path, speculative_config=ngram) == plain
    assert _generate(path, speculative_config={"model": path, "num_speculative_tokens": 3}) == plain


def _prompt_logprobs(path: str, **options: Any) -> list[list[float]]:
    """Each prompt's scores (``prompt_logprobs``), asked after the prompts ran once (with
    prefix caching their blocks are cached: a scoring request must compute them anyway)."""
    llm = LLM(path, **{**ENGINE_SETTINGS, **options})
    try:
        llm.generate(_prompts(), SamplingParams(max_tokens=1), use_tqdm=False)
        scored = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=1)
        results = llm.generate(_prompts(), scored, use_tqdm=False)
        scores = []
        for result in results:
            assert result.prompt_logprobs is not None and result.prompt_logprobs[0] is None
            scores.append([entry.logprob for entry in result.prompt_logprobs[1:]])  # type: ignore[union-attr]
        return scores
    finally:
        llm.engine.close()


@pytest.mark.parametrize("family", CONFIGS)
def test_prompt_logprobs_are_the_same_with_graphs_chunks_and_a_cached_prefix(
    family: str, checkpoints: dict[str, str]
) -> None:
    path = checkpoints[family]
    eager = _prompt_logprobs(
        path, use_cuda_graphs=False, use_chunked_prefill=False, use_prefix_caching=False
    )
    chunks = {"prefill_chunk_size": 16, "long_prefill_threshold": 0}
    for options in ({}, chunks):  # defaults: graphs, chunks, prefix cache
        for ours, reference in zip(_prompt_logprobs(path, **options), eager, strict=True):
            torch.testing.assert_close(
                torch.tensor(ours), torch.tensor(reference), atol=0.1, rtol=0.02
            )


def test_batches_beyond_the_largest_graph_fall_back_to_eager(checkpoints: dict[str, str]) -> None:
    path = checkpoints["llama"]
    options = {"max_batch_size": 4, "num_gpu_blocks": 512}
    assert _generate(path, **options) == _generate(path, use_cuda_graphs=False, **options)


def test_dummy_llama_3_2_3b_generates_in_bf16() -> None:
    llm = LLM("llama-3.2-3b", load_format="dummy", max_batch_size=8, max_seq_len=512)
    (result,) = llm.generate([[128000, 791, 6864, 315]], GREEDY, use_tqdm=False)
    assert len(result.outputs[0].token_ids) == 32
    assert llm.engine.dtype == torch.bfloat16 and llm.engine.device.type == "cuda"


def test_the_cuda_graph_memory_is_reported(checkpoints: dict[str, str]) -> None:
    llm = LLM(
        checkpoints["qwen3"],
        load_format="dummy",
        max_batch_size=16,
        max_seq_len=1024,
        num_gpu_blocks=256,
    )
    graphs = llm.engine.runner.graphs
    assert graphs is not None and graphs.memory_bytes > 0


def _mixed_and_decode_steps(block_size: int) -> list[list[ScheduledSequence]]:
    """A step of prompt chunks, a cached prefix and decode rows (contexts past Gemma's window
    of 64), and a decode-only step; blocks are taken in turn from a free pool."""
    generator = torch.Generator().manual_seed(5)
    blocks = iter(range(1, 512))

    def seq(computed: int, new: int) -> ScheduledSequence:
        table = [next(blocks) for _ in range(-(-(computed + new) // block_size))]
        tokens = torch.randint(10, 4096, (new,), generator=generator).tolist()
        return ScheduledSequence(table, computed, tokens)

    mixed = [seq(0, 300), seq(200, 1), seq(64, 100), seq(90, 1), seq(500, 37), seq(3, 1)]
    decode = [seq(150, 1), seq(700, 1), seq(20, 1)]
    return [mixed, decode]


@pytest.mark.parametrize("family", CONFIGS)
def test_step_graphs_replay_what_the_eager_step_computes(
    family: str, checkpoints: dict[str, str]
) -> None:
    """Mixed and decode steps replayed from graphs: the same as the padded step run eagerly
    (same kernels, same shapes), and within bf16 rounding of the step run unpadded."""
    llm = LLM(
        checkpoints[family],
        load_format="dummy",
        dtype="bfloat16",
        num_gpu_blocks=512,
        max_seq_len=1024,
        max_batch_size=16,
    )
    graphs, model = llm.engine.runner.graphs, llm.engine.model
    assert graphs is not None
    for seqs in _mixed_and_decode_steps(llm.engine.pool.block_size):
        with torch.inference_mode():
            input_ids, meta = build_metadata(seqs, llm.engine.pool.block_size, llm.engine.device)
            hidden = model(input_ids, meta)
            bucket = graphs.bucket_for(seqs)
            assert bucket is not None and bucket.decode == (len(input_ids) == len(seqs))
            unpadded = model.compute_logits(hidden) if bucket.decode else hidden
            replayed = graphs.run(seqs)
            assert replayed is not None
            replayed = replayed.clone()
            graphs.load(bucket, seqs)
            padded = graphs.forward(bucket)[: replayed.shape[0]]
        torch.testing.assert_close(replayed, padded, atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(replayed.float(), unpadded.float(), atol=5e-2, rtol=5e-2)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="tensor parallelism needs two GPUs")
@pytest.mark.parametrize("family", CONFIGS)
def test_two_ranks_over_nccl_generate_what_one_gpu_generates(
    family: str, checkpoints: dict[str, str]
) -> None:
    """In float32 (each rank holds only its shard of the LM head, so it cannot be sharpened
    like the others): same greedy tokens, with CUDA graphs capturing the all-reduces."""
    one = _generate(checkpoints[family], sharpen=False, dtype="float32")
    two = _generate(checkpoints[family], sharpen=False, dtype="float32", tensor_parallel_size=2)
    assert two == one
