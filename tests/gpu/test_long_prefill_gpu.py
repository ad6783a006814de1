"""On a GPU, in bf16, at 8k and 32k tokens: long rows through the fused path (FlashAttention-4
where it is installed, sliding windows included; torch's cuDNN attention, and FlashAttention-2
where cuDNN is missing) give what the Triton kernels give, beside the rows the Triton kernels
keep; and an engine with the fused path generates what one without it generates."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch
from tests.conftest import TINY_CONFIGS

import infer.attention as attention_module
import infer.attention.long_prefill as long_prefill_module
from infer import LLM, SamplingParams
from infer.attention import ScheduledSequence, attend, build_metadata
from infer.attention.flash_attn4 import flash_attn4_available
from infer.attention.long_prefill import LONG_ROW_TOKENS

pytestmark = pytest.mark.gpu

LLAMA = (24, 8, 128)  # Llama-3.2-3B's attention heads: query, KV, head_dim
GEMMA = (4, 1, 256)  # Gemma 3 1B's
BLOCK = 16
K = 1024


def _rope_table(length: int, head_dim: int) -> torch.Tensor:
    inv_freq = 1.0 / 500000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim)
    freqs = torch.outer(torch.arange(length).float(), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).cuda()


def _step(
    specs: list[tuple[int, int]], heads: tuple[int, int, int]
) -> tuple[list[ScheduledSequence], int]:
    """Sequences ``[(context_len, new_tokens), ...]`` on shuffled blocks, and the blocks."""
    needed = [math.ceil(ctx / BLOCK) for ctx, _ in specs]
    order = torch.randperm(sum(needed), generator=torch.Generator().manual_seed(0)).tolist()
    seqs, used = [], 0
    for (ctx, new), n in zip(specs, needed, strict=True):
        seqs.append(ScheduledSequence(order[used : used + n], ctx - new, [0] * new))
        used += n
    return seqs, sum(needed)


def _attend_both(
    specs: list[tuple[int, int]], heads: tuple[int, int, int], window: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's step through ``attend``: with the fused path's plan, and without it (the
    Triton kernels for every row, the reference), on equal caches."""
    num_heads, num_kv_heads, head_dim = heads
    seqs, num_blocks = _step(specs, heads)
    torch.manual_seed(0)
    shape = (num_blocks, num_kv_heads, BLOCK, head_dim)
    k_cache = torch.randn(shape, device="cuda", dtype=torch.bfloat16)  # the prefixes' K/V
    v_cache = torch.randn_like(k_cache)
    tokens = sum(new for _, new in specs)
    q = torch.randn(tokens, num_heads, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(tokens, num_kv_heads, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    cos_sin = _rope_table(max(ctx for ctx, _ in specs), head_dim)
    outs = []
    for long_rows in (LONG_ROW_TOKENS, 0):
        _, meta = build_metadata(seqs, BLOCK, torch.device("cuda"), long_rows)
        assert (meta.long_prefill is not None) == (long_rows > 0)
        out = attend(
            q.clone(), k, v, k_cache.clone(), v_cache.clone(), meta,
            cos_sin=cos_sin, scale=head_dim**-0.5, sliding_window=window,
        )  # fmt: skip
        outs.append(out)
    return outs[0], outs[1]


def _assert_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    assert (out.float() - ref.float()).abs().mean() < 1e-3


STEPS = {
    "8k-prompt": [(8 * K, 8 * K)],
    "8k-chunk-after-8k": [(16 * K, 8 * K)],
    "32k-prompt": [(32 * K, 32 * K)],
    "8k-chunk-after-24k": [(32 * K, 8 * K)],
    # decode rows, a short chunk and two long rows (one after a prefix) in one step
    "mixed": [(3000, 1), (32 * K, 8 * K), (700, 300), (8 * K, 8 * K), (5000, 1)],
}


@pytest.fixture(params=["flash4", "cudnn"])
def fused_kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each kernel of the fused path: FlashAttention-4 (where installed), and cuDNN."""
    if request.param == "flash4" and not flash_attn4_available(torch.device("cuda")):
        pytest.skip("flash-attn-4 is not installed (the optional `flash4` extra)")
    if request.param == "cudnn":
        monkeypatch.setattr(long_prefill_module, "flash_attn4_available", lambda device: False)
    return str(request.param)


@pytest.mark.parametrize("heads", [LLAMA, GEMMA], ids=["llama", "gemma"])
@pytest.mark.parametrize("step", STEPS)
def test_fused_long_rows_match_the_triton_kernels(
    step: str, heads: tuple[int, int, int], fused_kernel: str
) -> None:
    out, ref = _attend_both(STEPS[step], heads)
    _assert_close(out, ref)


@pytest.mark.parametrize("step", ["8k-chunk-after-24k", "mixed"])
def test_without_cudnn_flash_attention_serves_the_prefix_split(
    step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(long_prefill_module, "flash_attn4_available", lambda device: False)
    monkeypatch.setattr(long_prefill_module, "_has_cudnn_attention", lambda device: False)
    out, ref = _attend_both(STEPS[step], LLAMA)
    _assert_close(out, ref)


@pytest.mark.parametrize("window", [512, 1024])  # Gemma 3 1B's, and the larger models'
@pytest.mark.parametrize("step", STEPS)
def test_sliding_window_layers_take_flash_attention_4_over_their_window(
    step: str, window: int
) -> None:
    if not flash_attn4_available(torch.device("cuda")):
        pytest.skip("flash-attn-4 is not installed (the optional `flash4` extra)")
    out, ref = _attend_both(STEPS[step], GEMMA, window)
    _assert_close(out, ref)


def test_without_flash_attention_4_sliding_window_layers_keep_the_triton_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(long_prefill_module, "flash_attn4_available", lambda device: False)
    out, ref = _attend_both(STEPS["mixed"], GEMMA, window=512)
    assert torch.equal(out, ref)


# Tiny test shapes with the real models' head_dim and room for the prompts below; Gemma's
# with every other layer's window of 512 tokens.
LONG_CONFIG = {
    **TINY_CONFIGS["llama"],
    "num_attention_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 8192,
}
LONG_GEMMA_CONFIG = {
    **TINY_CONFIGS["gemma3"],
    "head_dim": 256,
    "max_position_embeddings": 8192,
    "sliding_window": 512,
}


@pytest.mark.parametrize("config", [LONG_CONFIG, LONG_GEMMA_CONFIG], ids=["llama", "gemma"])
def test_an_engine_with_the_fused_path_generates_what_one_without_it_generates(
    config: dict[str, Any], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prompts of 6,000 and 3,000 tokens in steps of 2,500 (eager, so their chunks take the
    fused path, with and without a prefix; the last chunks replay graphs)."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    calls = []
    fused = attention_module.long_prefill_attention
    monkeypatch.setattr(
        attention_module,
        "long_prefill_attention",
        lambda *args, **kwargs: calls.append(len(args[4])) or fused(*args, **kwargs),
    )
    generator = torch.Generator().manual_seed(3)
    vocab = config["vocab_size"]
    prompts = [torch.randint(10, vocab, (n,), generator=generator).tolist() for n in (6000, 3000)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)

    def generate(**options: Any) -> list[list[int]]:
        llm = LLM(
            str(tmp_path), load_format="dummy", dtype="bfloat16", num_gpu_blocks=1024,
            max_seq_len=8192, max_num_batched_tokens=2500, **options,
        )  # fmt: skip
        calls.clear()  # (the warm-up runs the fused path too)
        try:
            with torch.no_grad():  # so bf16 rounding cannot flip the random model's near-ties
                llm.engine.model.lm_head.weight.mul_(8.0)
            results = llm.generate(prompts, params, use_tqdm=False)
            return [r.outputs[0].token_ids for r in results]
        finally:
            llm.engine.close()

    reference = generate(use_sdpa_prefill=False)
    assert calls == []
    assert generate() == reference
    assert calls  # the fused path ran


def test_a_decode_step_with_a_long_row_replays_what_the_eager_step_computes(
    tmp_path: Any,
) -> None:
    """Eleven short rows and one of 6,000 tokens: the decode graph that splits keys more
    (the long variant of its size) gives the eager step's logits."""
    (tmp_path / "config.json").write_text(json.dumps(LONG_CONFIG))
    llm = LLM(
        str(tmp_path), load_format="dummy", dtype="bfloat16", num_gpu_blocks=1024,
        max_seq_len=8192, max_batch_size=16,
    )  # fmt: skip
    try:
        graphs, model = llm.engine.runner.graphs, llm.engine.model
        block_size = llm.engine.pool.block_size
        blocks = iter(range(1, 1024))

        def seq(context: int) -> ScheduledSequence:
            table = [next(blocks) for _ in range(-(-(context + 1) // block_size))]
            return ScheduledSequence(table, context, [7])

        seqs = [seq(100 + 37 * i) for i in range(11)] + [seq(6000)]
        assert graphs is not None
        with torch.inference_mode():
            input_ids, meta = build_metadata(seqs, block_size, llm.engine.device)
            eager = model.compute_logits(model(input_ids, meta))
            bucket = graphs.bucket_for(seqs)
            assert bucket is not None and bucket.long
            replayed = graphs.run(seqs)
            assert replayed is not None
        torch.testing.assert_close(replayed.float(), eager.float(), atol=5e-2, rtol=5e-2)
    finally:
        llm.engine.close()
