"""Triton kernels against their torch references in bf16 on a GPU, at real model shapes.

Also captures the decode attention in a CUDA graph and replays it with new lengths and block
tables, as the engine's decode graphs do.
"""

from __future__ import annotations

import math

import pytest
import torch

from infer.attention import attend
from infer.attention.metadata import AttentionMetadata, ScheduledSequence, build_metadata
from infer.attention.torch_backend import paged_attention_torch
from infer.attention.triton_backend import paged_attention_triton
from infer.kernels.activation import gelu_tanh_and_mul_torch, silu_and_mul_torch
from infer.kernels.activation_triton import gelu_tanh_and_mul_triton, silu_and_mul_triton
from infer.kernels.compile_ahead import compiling_ahead
from infer.kernels.jit_log import JIT_LOG
from infer.kernels.kv_write import write_kv_torch
from infer.kernels.paged_attention import triton_paged_attention
from infer.kernels.rms_norm import fused_add_rms_norm_torch, rms_norm_torch
from infer.kernels.rms_norm_triton import fused_add_rms_norm_triton, rms_norm_triton
from infer.kernels.rope import apply_rope_torch
from infer.kernels.rope_kv_write_triton import rope_and_write_kv_triton

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

BF16 = torch.bfloat16
BLOCK = 16
# name: (query heads, KV heads, head_dim, sliding window of its local layers)
MODELS = {
    "llama-3.2-3b": (24, 8, 128, 0),
    "gemma-3-1b": (4, 1, 256, 512),
    "qwen3-4b": (32, 8, 128, 0),
}
MIXED = [(1, 1), (17, 1), (1000, 1), (4000, 1), (1000, 1000), (2048, 512), (700, 37), (33, 32)]


def paged_batch(
    specs: list[tuple[int, int]], num_heads: int, num_kv_heads: int, head_dim: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    """bf16 q and caches for ``[(context_len, query_len), ...]`` on randomly placed blocks."""
    torch.manual_seed(seed)
    needed = [math.ceil(ctx / BLOCK) for ctx, _ in specs]
    owned = torch.randperm(sum(needed) + 8).tolist()
    seqs, used = [], 0
    for (ctx, qlen), n in zip(specs, needed, strict=True):
        seqs.append(ScheduledSequence(owned[used : used + n], ctx - qlen, [0] * qlen))
        used += n
    _, meta = build_metadata(seqs, BLOCK, torch.device("cuda"))
    shape = (len(owned), num_kv_heads, BLOCK, head_dim)
    k_cache = torch.randn(shape, device="cuda", dtype=BF16)
    v_cache = torch.randn(shape, device="cuda", dtype=BF16)
    q = torch.randn(meta.positions.shape[0], num_heads, head_dim, device="cuda", dtype=BF16)
    return q, k_cache, v_cache, meta


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata, window: int
) -> torch.Tensor:
    scale = q.shape[-1] ** -0.5
    return paged_attention_torch(q.float(), k.float(), v.float(), meta, scale, window)


def assert_attention_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    """Seed 000's bf16 bound (max abs diff < 1e-2) and a relative-norm check."""
    diff = out.float() - ref
    assert diff.abs().max().item() < 1e-2
    assert (diff.norm() / ref.norm()).item() < 1e-2


def model_windows(name: str) -> list[int]:
    window = MODELS[name][3]
    return [0, window] if window else [0]


@pytest.mark.parametrize(
    ("model", "window"), [(m, w) for m in MODELS for w in model_windows(m)]
)  # fmt: skip
def test_mixed_batch(model: str, window: int) -> None:
    heads, kv_heads, head_dim, _ = MODELS[model]
    q, k, v, meta = paged_batch(MIXED, heads, kv_heads, head_dim)
    out = paged_attention_triton(q, k, v, meta, head_dim**-0.5, window)
    assert_attention_close(out, reference(q, k, v, meta, window))


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("batch", [1, 16, 64])
def test_decode_batch(model: str, batch: int) -> None:
    heads, kv_heads, head_dim, window = MODELS[model]
    gen = torch.Generator().manual_seed(batch)
    # One long context: many splits, merged by the combine kernel; 16 sequences: a few
    # splits, merged by the last split to finish; 64 fill the GPU without splits.
    lens = [16384] if batch == 1 else torch.randint(1, 4097, (batch,), generator=gen).tolist()
    q, k, v, meta = paged_batch([(n, 1) for n in lens], heads, kv_heads, head_dim)
    for layer in range(2):  # a second call on the same step reuses the split scratch
        out = paged_attention_triton(q + layer, k, v, meta, head_dim**-0.5, window)
        assert_attention_close(out, reference(q + layer, k, v, meta, window))


def test_seeds_entry_point_with_window() -> None:
    heads, kv_heads, head_dim, window = MODELS["gemma-3-1b"]
    q, k, v, meta = paged_batch([(3000, 1), (513, 1), (100, 1)], heads, kv_heads, head_dim)
    out = triton_paged_attention(
        q[:, :, None], k, v, meta.block_tables, meta.seq_lens, scale=head_dim**-0.5,
        max_num_blocks=meta.block_tables.shape[1], window_size=window,
    )  # fmt: skip
    assert_attention_close(out[:, :, 0], reference(q, k, v, meta, window))


@pytest.mark.parametrize("model", ["llama-3.2-3b", "gemma-3-1b"])
def test_cuda_graph_decode_replay(model: str) -> None:
    """Capture once with the model's maximum length; replays follow the new seq_lens."""
    heads, kv_heads, head_dim, window = MODELS[model]
    batch, max_len = 8, 4096
    width = max_len // BLOCK
    num_blocks = batch * width + 1
    k = torch.randn(num_blocks, kv_heads, BLOCK, head_dim, device="cuda", dtype=BF16)
    v = torch.randn_like(k)
    static = AttentionMetadata(
        positions=torch.zeros(batch, dtype=torch.int64, device="cuda"),
        slot_mapping=torch.zeros(batch, dtype=torch.int64, device="cuda"),
        block_tables=torch.zeros(batch, width, dtype=torch.int32, device="cuda"),
        seq_lens=torch.ones(batch, dtype=torch.int32, device="cuda"),
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device="cuda"),
        max_query_len=1,
        max_seq_len=max_len,
        row_order=torch.arange(batch, dtype=torch.int32, device="cuda"),
        row_counts=torch.tensor([batch, 0], dtype=torch.int32, device="cuda"),
        token_rows=torch.arange(batch, dtype=torch.int32, device="cuda"),
    )
    q = torch.randn(batch, heads, head_dim, device="cuda", dtype=BF16)
    run = lambda: paged_attention_triton(q, k, v, static, head_dim**-0.5, window)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()  # compile and allocate outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for step, lens in enumerate(
        [[1, 16, 17, 100, 1000, 2049, 4000, 4096], [5] * batch, [4096, 1, 513, 512, 3, 77, 2, 1]]
    ):
        torch.manual_seed(step)
        tables = torch.randperm(num_blocks - 1, device="cuda")[: batch * width] + 1
        static.block_tables.copy_(tables.view(batch, width).int())
        static.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        graph.replay()
        fresh = AttentionMetadata(
            positions=static.positions, slot_mapping=static.slot_mapping,
            block_tables=static.block_tables.clone(), seq_lens=static.seq_lens.clone(),
            query_start_loc=static.query_start_loc, max_query_len=1, max_seq_len=max(lens),
            row_order=static.row_order, row_counts=static.row_counts, token_rows=static.token_rows,
        )  # fmt: skip
        assert_attention_close(out, reference(q, k, v, fresh, window))


def test_attend_rotates_writes_then_attends(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dispatching entry point on CUDA (one fused rotate-and-write kernel) writes what
    the torch path writes, then attends."""
    heads, kv_heads, head_dim, _ = MODELS["qwen3-4b"]
    q, k_cache, v_cache, meta = paged_batch([(300, 300), (900, 1), (64, 20)], heads, kv_heads, 128)
    k_new = torch.randn(q.shape[0], kv_heads, head_dim, device="cuda", dtype=BF16)
    v_new = torch.randn_like(k_new)
    cos_sin = rope_table(head_dim, 1024)
    k_ref, v_ref, q_ref = k_cache.clone(), v_cache.clone(), q.clone()
    out = attend(q, k_new, v_new, k_cache, v_cache, meta, cos_sin=cos_sin, scale=head_dim**-0.5)
    monkeypatch.setenv("INFER_DISABLE_TRITON", "1")
    expected = attend(
        q_ref, k_new, v_new, k_ref, v_ref, meta, cos_sin=cos_sin, scale=head_dim**-0.5
    )
    assert_bf16_close(k_cache, k_ref)
    assert torch.equal(v_cache, v_ref)
    assert_attention_close(out, expected.float())


def assert_bf16_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


def rope_table(head_dim: int, positions: int) -> torch.Tensor:
    """cos | sin ``[positions, head_dim]`` at Llama 3's base (float32, as the models keep it)."""
    inv_freq = 1.0 / (5e5 ** (torch.arange(0, head_dim, 2, device="cuda").float() / head_dim))
    freqs = torch.outer(torch.arange(positions, device="cuda").float(), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


@pytest.mark.parametrize(("hidden", "offset"), [(3072, 0.0), (1152, 1.0), (2560, 0.0)])
def test_rms_norms(hidden: int, offset: float) -> None:
    x = torch.randn(257, hidden, device="cuda", dtype=BF16)
    residual = torch.randn_like(x)
    weight = torch.randn(hidden, device="cuda", dtype=BF16)
    assert_bf16_close(
        rms_norm_triton(x, weight, 1e-6, offset), rms_norm_torch(x, weight, 1e-6, offset)
    )
    normed, summed = fused_add_rms_norm_triton(x, residual, weight, 1e-6, offset)
    ref_normed, ref_summed = fused_add_rms_norm_torch(x, residual, weight, 1e-6, offset)
    assert torch.equal(summed, ref_summed)
    assert_bf16_close(normed, ref_normed)
    per_head = x.view(257, -1, 128)  # Qwen3's q/k norm over head_dim
    head_weight = weight[:128]
    assert_bf16_close(
        rms_norm_triton(per_head, head_weight, 1e-6), rms_norm_torch(per_head, head_weight, 1e-6)
    )


def test_gated_activations() -> None:
    x = torch.randn(257, 2 * 8192, device="cuda", dtype=BF16)
    assert_bf16_close(silu_and_mul_triton(x), silu_and_mul_torch(x))
    assert_bf16_close(gelu_tanh_and_mul_triton(x), gelu_tanh_and_mul_torch(x))


@pytest.mark.parametrize("model", list(MODELS))
def test_rope_and_kv_write_on_qkv_views(model: str) -> None:
    heads, kv_heads, head_dim, _ = MODELS[model]
    tokens = 300
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device="cuda", dtype=BF16)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=1)
    q, k, v = (t.view(tokens, -1, head_dim) for t in (q, k, v))
    positions = torch.randint(0, 8192, (tokens,), device="cuda")
    cache = rope_table(head_dim, 8192)
    slots = torch.randperm(64 * BLOCK, device="cuda")[:tokens]
    slots[::7] = -1
    k_cache = torch.randn(64, kv_heads, BLOCK, head_dim, device="cuda", dtype=BF16)
    v_cache = torch.randn_like(k_cache)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    ref_q, ref_k = apply_rope_torch(q.clone(), k.clone(), positions, cache)
    write_kv_torch(ref_k, v, k_ref, v_ref, slots)
    rope_and_write_kv_triton(q, k, v, positions, cache, k_cache, v_cache, slots)
    assert_bf16_close(q, ref_q)
    assert_bf16_close(k_cache, k_ref)
    assert torch.equal(v_cache, v_ref)


def test_a_variant_compiled_ahead_is_built_on_exit_and_its_launch_builds_nothing() -> None:
    JIT_LOG.install()
    x = torch.randn(5, 3333, dtype=BF16, device="cuda")  # a width no other test uses
    weight = torch.randn(3333, dtype=BF16, device="cuda")
    before = len(JIT_LOG.variants)
    with compiling_ahead(x.device):
        rms_norm_triton(x, weight, 1e-6)  # recorded, not run
        assert len(JIT_LOG.variants) == before
    assert len(JIT_LOG.variants) == before + 1
    out = rms_norm_triton(x, weight, 1e-6)
    assert len(JIT_LOG.variants) == before + 1
    torch.testing.assert_close(out, rms_norm_torch(x, weight, 1e-6), atol=2e-2, rtol=2e-2)
