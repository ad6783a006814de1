"""How close can Triton get to SDPA's causal prefill on this GPU? (GPU only)

``bench_kernels.py`` compares the paged prefill kernel with ``scaled_dot_product_attention``;
this script explains the gap. For each shape it times, graph-replayed, in TFLOP/s:

* SDPA with each backend (on an H100 the default is cuDNN's Hopper kernel);
* the paged kernel over a block-16 cache (``paged16``) and over a cache with one block per
  sequence (``contiguous``: the same kernel without the gather), with several tiles;
* ``tma``: a plain causal FlashAttention-2 loop over contiguous q/k/v fed by TMA descriptors,
  with and without Triton's warp specialisation: what Triton reaches with no paging at all.

Usage: ``PYTHONPATH=src python benchmarks/prefill_ceiling.py [--output PATH]`` (JSON lines,
then a table). Prompts of 8k to 128k tokens, with cuDNN's attention and the engine's path for
them among the candidates: ``prefill_ceiling_long.py``.
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.tools.tensor_descriptor import TensorDescriptor

from bench_kernels import GEMMA, LLAMA, Call, causal_flops, graph_ms, prefill_call
from infer.attention.metadata import ScheduledSequence, build_metadata
from infer.attention.triton_backend import paged_attention_triton
from infer.kernels.paged_attention import TileConfig

SHAPES = [(LLAMA, [4096]), (LLAMA, [512] * 8), (GEMMA, [4096])]
TILES = {
    128: [(128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3)],
    256: [(128, 64, 8, 2), (64, 64, 4, 2)],
}
TMA_CONFIGS = [(128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 4, 3)]
BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}
ROWS: list[dict[str, Any]] = []


def emit(**row: Any) -> None:
    print(json.dumps(row), flush=True)
    ROWS.append(row)


# fmt: off
@triton.jit
def _tma_range(acc, m_i, l_i, q, k_desc, v_desc, row0, col, lo, hi, q_pos, qk_scale,
               BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    for n0 in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        k = k_desc.load([row0 + n0, col])
        s = tl.dot(q, tl.trans(k))
        if CAUSAL_MASK:
            s = tl.where(q_pos[:, None] >= (n0 + offs_n)[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = v_desc.load([row0 + n0, col])
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _tma_prefill_kernel(q_desc, k_desc, v_desc, o_desc, seq_len, qk_scale,
                        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    """One program per (query tile, query head) of equal-length sequences laid end to end."""
    tiles = tl.cdiv(seq_len, BLOCK_M)
    pid = tl.program_id(0)
    m0 = (tiles - 1 - pid % tiles) * BLOCK_M  # long tiles first
    row0 = (pid // tiles) * seq_len
    head = tl.program_id(1)
    q_pos = m0 + tl.arange(0, BLOCK_M)
    q = q_desc.load([row0 + m0, head * HEAD_DIM])
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    col = (head // GROUP) * HEAD_DIM
    acc, m_i, l_i = _tma_range(acc, m_i, l_i, q, k_desc, v_desc, row0, col, 0, m0, q_pos,
                               qk_scale, BLOCK_N, False, WARP_SPECIALIZE)
    acc, m_i, l_i = _tma_range(acc, m_i, l_i, q, k_desc, v_desc, row0, col, m0, m0 + BLOCK_M,
                               q_pos, qk_scale, BLOCK_N, True, False)
    o_desc.store([row0 + m0, head * HEAD_DIM], (acc / l_i[:, None]).to(o_desc.dtype))
# fmt: on


def tma_prefill(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_len: int, config: tuple[int, ...]
) -> torch.Tensor:
    """Causal attention of ``q [T, H, D]`` over ``k, v [T, Hkv, D]`` (sequences of ``seq_len``)."""
    block_m, block_n, num_warps, num_stages, warp_specialize = config
    tokens, num_heads, head_dim = q.shape
    out = torch.empty_like(q)
    flat = [x.view(tokens, -1) for x in (q, k, v, out)]
    boxes = [block_m, block_n, block_n, block_m]
    q_desc, k_desc, v_desc, o_desc = (
        TensorDescriptor.from_tensor(x, [box, head_dim]) for x, box in zip(flat, boxes)
    )
    grid = (tokens // seq_len * triton.cdiv(seq_len, block_m), num_heads)
    _tma_prefill_kernel[grid](
        q_desc, k_desc, v_desc, o_desc, seq_len, head_dim**-0.5 * 1.4426950408889634,
        GROUP=num_heads // k.shape[1], HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
        WARP_SPECIALIZE=bool(warp_specialize), num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out


def contiguous_cache_call(
    lens: list[int], heads: tuple[int, int, int], tile: TileConfig | None = None
) -> Call:
    """The paged kernel with one block per sequence (block size = its length): no gather."""
    num_heads, num_kv_heads, head_dim = heads
    seqs = [ScheduledSequence([i], 0, [0] * n) for i, n in enumerate(lens)]
    meta = build_metadata(seqs, lens[0], torch.device("cuda"))[1]
    k = torch.randn(len(lens), num_kv_heads, lens[0], head_dim, device="cuda").bfloat16()
    v = torch.randn_like(k)
    q = torch.randn(sum(lens), num_heads, head_dim, device="cuda").bfloat16()
    return partial(paged_attention_triton, q, k, v, meta, head_dim**-0.5, prefill_tile=tile)


def time_sdpa(shape: dict[str, Any], lens: list[int], heads: tuple[int, int, int]) -> None:
    num_heads, _, head_dim = heads
    q = torch.randn(len(lens), num_heads, lens[0], head_dim, device="cuda").bfloat16()
    k, v = torch.randn_like(q), torch.randn_like(q)
    for name, backend in [("default", None), *BACKENDS.items()]:
        if backend is None:
            call: Call = partial(F.scaled_dot_product_attention, q, k, v, is_causal=True)
        else:

            def call(backend: SDPBackend = backend) -> torch.Tensor:
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        try:
            emit(**shape, kind="sdpa", variant=name, tflops=tflops(shape, call))
        except RuntimeError as err:  # the backend does not take this shape
            emit(**shape, kind="sdpa", variant=name, error=str(err)[:120])


def time_tma(shape: dict[str, Any], lens: list[int], heads: tuple[int, int, int]) -> None:
    num_heads, num_kv_heads, head_dim = heads
    tokens, seq_len, group = sum(lens), lens[0], num_heads // num_kv_heads
    q = torch.randn(tokens, num_heads, head_dim, device="cuda").bfloat16()
    k = torch.randn(tokens, num_kv_heads, head_dim, device="cuda").bfloat16()
    v = torch.randn_like(k)

    def as_batch(x: torch.Tensor) -> torch.Tensor:
        return x.view(len(lens), seq_len, -1, head_dim).transpose(1, 2)

    expanded = [as_batch(x).repeat_interleave(group, 1) for x in (k, v)]
    ref = F.scaled_dot_product_attention(as_batch(q), *expanded, is_causal=True)
    for config in [(*c, ws) for ws in (0, 1) for c in TMA_CONFIGS]:
        call = partial(tma_prefill, q, k, v, seq_len, config)
        try:
            error = (as_batch(call()) - ref).abs().max().item()
            emit(**shape, kind="tma", tile=config, tflops=tflops(shape, call), max_err=error)
        except Exception as err:  # a configuration Triton cannot compile
            emit(**shape, kind="tma", tile=config, error=str(err).strip().splitlines()[-1][:120])


def tflops(shape: dict[str, Any], call: Call) -> float:
    return round(shape["flops"] / graph_ms([call]) / 1e9, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, help="also write the rows here (JSON lines)")
    args = parser.parse_args()
    torch.manual_seed(0)
    for heads, lens in SHAPES:
        shape = {
            "heads": "/".join(map(str, heads)),
            "lens": f"{len(lens)}x{lens[0]}",
            "flops": causal_flops(lens, heads[0], heads[2]),
        }
        time_sdpa(shape, lens, heads)
        for tile in [TileConfig(*t) for t in TILES[heads[2]]]:
            for name, make in (("paged16", prefill_call), ("contiguous", contiguous_cache_call)):
                call = make(lens, heads, tile=tile)
                emit(**shape, kind=name, tile=list(vars(tile).values()), tflops=tflops(shape, call))
        if heads[2] == 128:
            time_tma(shape, lens, heads)
    if args.output:
        args.output.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    print(
        f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}"
    )
    print("| heads | seqs x len | variant | tile | TFLOP/s | % of SDPA default |")
    print("|---|---|---|---|---:|---:|")
    best: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in ROWS:
        variant = row["kind"] if row["kind"] != "sdpa" else f"sdpa-{row['variant']}"
        key = (row["heads"], row["lens"], variant)
        if "tflops" in row and (key not in best or row["tflops"] > best[key]["tflops"]):
            best[key] = row
    for (heads_text, lens_text, variant), row in best.items():
        sdpa = best[(heads_text, lens_text, "sdpa-default")]["tflops"]
        print(f"| {heads_text} | {lens_text} | {variant} | {row.get('tile', '-')} "
              f"| {row['tflops']} | {100 * row['tflops'] / sdpa:.0f}% |")  # fmt: skip


if __name__ == "__main__":
    main()
