"""How fast can long prompts be prefilled on this GPU, and how fast does the engine do it? (GPU)

``prefill_ceiling.py``'s successor for long prompts (issue 48;
``benchmarks/results-by-topic/14-long-context.md``). Times, eagerly with CUDA events (every
call here is >= ~1 ms of GPU work), in TFLOP/s:

* ``env``: torch / cuDNN versions, which private SDPA ops exist, torch's flash implementations.
* ``full``: causal prefill of one 8k / 32k / 128k sequence, Llama-3.2-3B heads (24/8/128):
  SDPA per backend (cuDNN, FlashAttention-2, memory-efficient), KV heads expanded or
  ``enable_gqa``, inputs contiguous or strided views of the ``[T, H, D]`` projections, the
  private cuDNN op with its log-sum-exp; FlashAttention-4 (``flash4``, where the optional
  ``flash-attn-4`` package is installed); our Triton paged prefill over a block-16 cache; and
  ``engine``: what the engine runs for such a row (``attention.long_prefill``, gather
  included).
* ``prefix``: a chunk of 8k / 16k new tokens after a cached prefix of 16k..120k tokens (the
  prefix in the paged pool): Triton paged; gather + SDPA with ``causal_lower_right``; split
  (chunk vs itself, causal, + chunk vs the gathered prefix, no mask) merged by log-sum-exps;
  ``flash4`` over the contiguous K/V (its mask aligned bottom right, no split); ``engine``.
* ``gemma``: the same at Gemma 3's heads (4/1/256), and with windows of 512 and 1,024 keys:
  Triton paged, ``flash4`` with its local mask, ``engine`` (a window's blocks gathered).
* ``flex``: FlexAttention compile time and rate (8k causal; 8k over a 24k prefix).
* ``decode``: split-KV counts for 16 x 32k and 1 x 128k decode rows (graph-replayed).

Every row carries ``max_err`` against the Triton paged kernel's output on the same inputs and
``cold_ms``, its first call (compiles, cuDNN's plan for a new shape). Each part catches its
own errors; the probe starts no new part after ``--budget-s``. ``--kinds`` keeps only some
candidates (the others' rows are skipped). A table of each shape's best rates comes last.

Usage: ``PYTHONPATH=src python benchmarks/prefill_ceiling_long.py --out DIR [--small]``
(``--small``: tiny shapes, float32, on any device, for a dry run; set TRITON_INTERPRET=1 on CPU).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from infer.attention.flash_attn4 import causal_attention, flash_attn4_available
from infer.attention.long_prefill import LONG_ROW_TOKENS, long_prefill_attention
from infer.attention.metadata import ScheduledSequence, build_metadata
from infer.attention.triton_backend import paged_attention_triton
from infer.kernels.paged_gather import gather_kv

LLAMA = (24, 8, 128)
GEMMA = (4, 1, 256)
BLOCK = 16
BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}
Call = Callable[[], Any]


class Probe:
    def __init__(self, out: Path, small: bool, budget_s: float, kinds: set[str]) -> None:
        self.out = out
        self.kinds = kinds  # candidates to time (all when empty; Triton's, the reference, always)
        self.small = small
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = torch.float32 if small else torch.bfloat16
        self.start = time.perf_counter()
        self.budget_s = budget_s
        self.rows: list[dict[str, Any]] = []
        out.mkdir(parents=True, exist_ok=True)
        self.file = (out / "probe.jsonl").open("w")

    def emit(self, **row: Any) -> None:
        row["t"] = round(time.perf_counter() - self.start, 1)
        line = json.dumps(row)
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()
        self.rows.append(row)

    def k(self, n: int) -> int:
        """``n`` thousand tokens (``n * 1024``), or a tiny stand-in with ``--small``."""
        return n * 2 if self.small else n * 1024

    def part(self, name: str, fn: Call) -> None:
        elapsed = time.perf_counter() - self.start
        if elapsed > self.budget_s:
            self.emit(part=name, skipped=f"budget spent ({elapsed:.0f} s)")
            return
        print(f"--- {name} at {elapsed:.1f} s", flush=True)
        try:
            fn()
        except Exception as err:  # one part's failure must not lose the others
            self.emit(part=name, error=f"{type(err).__name__}: {str(err)[:300]}")
            traceback.print_exc()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def time_ms(self, fn: Call, budget_s: float = 1.0) -> float:
        """Median of a few timed calls after one warm call (which compiles)."""
        fn()
        self.sync()
        if self.device.type != "cuda":
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        first = start.elapsed_time(end)
        reps = max(1, min(10, int(budget_s * 1e3 / max(first, 1e-3))))
        times = [first]
        for _ in range(reps):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    def measure(self, flops: float, fn: Call, ref: Tensor | None, **row: Any) -> Tensor | None:
        """Time ``fn`` (output ``[T, H, D]``), emit its rate and error; errors become rows."""
        if self.kinds and row["kind"] not in self.kinds and row["kind"] != "triton-paged":
            return None
        try:
            self.sync()
            t0 = time.perf_counter()
            out = fn()
            self.sync()
            cold_ms = (time.perf_counter() - t0) * 1e3  # first call: compiles, builds plans
            err = None if ref is None else (out.float() - ref.float()).abs().max().item()
            ms = self.time_ms(fn)
            self.emit(**row, ms=round(ms, 3), tflops=round(flops / ms / 1e9, 1), max_err=err,
                      cold_ms=round(cold_ms, 1))  # fmt: skip
            return out
        except Exception as exc:  # a backend that does not take this shape
            self.emit(**row, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            return None


# --- inputs ------------------------------------------------------------------------------
class Case:
    """One sequence: ``prefix`` cached tokens, ``chunk`` new ones; K/V of all of them in a
    paged pool (random block order) and the chunk's own K/V as the projections give them."""

    def __init__(self, probe: Probe, heads: tuple[int, int, int], prefix: int, chunk: int):
        num_heads, num_kv_heads, head_dim = heads
        dev, dt = probe.device, probe.dtype
        total = prefix + chunk
        self.heads, self.prefix, self.chunk, self.total = heads, prefix, chunk, total
        self.scale = head_dim**-0.5
        self.q = torch.randn(chunk, num_heads, head_dim, device=dev, dtype=dt)
        k_all = torch.randn(total, num_kv_heads, head_dim, device=dev, dtype=dt)
        v_all = torch.randn_like(k_all)
        self.k_all, self.v_all = k_all, v_all  # [prefix + C, Hkv, D]
        self.k_new, self.v_new = k_all[prefix:], v_all[prefix:]  # [C, Hkv, D] views
        blocks = math.ceil(total / BLOCK)
        table = torch.randperm(blocks, device=dev)
        shape = (blocks, num_kv_heads, BLOCK, head_dim)
        self.k_pool = torch.zeros(shape, device=dev, dtype=dt)
        self.v_pool = torch.zeros(shape, device=dev, dtype=dt)
        for pool, src in ((self.k_pool, k_all), (self.v_pool, v_all)):
            padded = F.pad(src, (0, 0, 0, 0, 0, blocks * BLOCK - total))
            pool[table] = padded.view(blocks, BLOCK, num_kv_heads, head_dim).transpose(1, 2)
        self.table = table
        seq = ScheduledSequence(table.tolist(), prefix, [0] * chunk)
        self.meta = build_metadata([seq], BLOCK, dev)[1]
        plan = build_metadata([seq], BLOCK, dev, LONG_ROW_TOKENS if not probe.small else 8)[1]
        assert plan.long_prefill is not None
        self.long_rows = plan.long_prefill.rows
        self.flops = 4 * num_heads * head_dim * (chunk * prefix + chunk * (chunk + 1) / 2)

    def triton(self, window: int = 0) -> Tensor:
        return paged_attention_triton(
            self.q, self.k_pool, self.v_pool, self.meta, self.scale, window
        )

    def engine(self, window: int = 0) -> Tensor:
        """What the engine runs for this row (``attention.long_prefill``) in a layer with
        this sliding window (0: none)."""
        out = torch.empty_like(self.q)
        long_prefill_attention(
            out, self.q, self.k_pool, self.v_pool, self.long_rows, self.scale,
            sliding_window=window,
        )  # fmt: skip
        return out

    def gather(self, upto: int) -> tuple[Tensor, Tensor]:
        """The first ``upto`` keys / values from the pool, ``[1, Hkv, upto, D]`` contiguous."""
        blocks = math.ceil(upto / BLOCK)
        idx = self.table[:blocks]
        out = []
        for pool in (self.k_pool, self.v_pool):
            g = pool.index_select(0, idx)  # [W, Hkv, BS, D]
            g = g.transpose(0, 1).reshape(pool.shape[1], blocks * BLOCK, -1)[:, :upto]
            out.append(g[None])
        return out[0], out[1]


def flash4(case: Case, window: int = 0) -> Tensor:
    """FlashAttention-4 over the case's contiguous ``[L, Hkv, D]`` K/V, causal (bottom right),
    each query over the last ``window`` keys up to its own (0: all)."""
    out = torch.empty_like(case.q)
    causal_attention(out, case.q, case.k_all, case.v_all, case.scale, window)
    return out


def bhsd(x: Tensor) -> Tensor:
    """``[T, H, D]`` → a ``[1, H, T, D]`` view (no copy)."""
    return x.transpose(0, 1)[None]


def expand(x: Tensor, group: int) -> Tensor:
    """``[1, Hkv, L, D]`` → ``[1, Hkv * group, L, D]`` (copied)."""
    return x.repeat_interleave(group, dim=1) if group > 1 else x


def tokens_first(out: Tensor) -> Tensor:
    """``[1, H, T, D]`` → ``[T, H, D]``."""
    return out[0].transpose(0, 1)


def cudnn_lse(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    out = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, causal, False, scale=scale
    )
    return out[0], out[1]


def flash_lse(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    out = torch.ops.aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, causal, False, scale=scale
    )
    return out[0], out[1]


def cudnn_varlen(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float
) -> tuple[Tensor, Tensor]:
    """cuDNN's varlen op on one sequence, ``[T, H, D]`` inputs (the projections' layout)."""
    dev = q.device
    cu_q = torch.tensor([0, q.shape[0]], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, k.shape[0]], dtype=torch.int32, device=dev)
    out = torch.ops.aten._cudnn_attention_forward(
        q, k, v, None, cu_q, cu_k, q.shape[0], k.shape[0], True, 0.0, causal, False, scale=scale
    )
    return out[0], out[1]


def math_lse(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    """Plain softmax with its log-sum-exp (``--small`` runs: checks the split and merge)."""
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    if causal:  # lower right: the last query sees every key
        lq, lk = s.shape[-2], s.shape[-1]
        keep = torch.ones(lq, lk, dtype=torch.bool, device=s.device).tril(lk - lq)
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return (torch.softmax(s, -1) @ v.float()).to(q.dtype), lse


def merge(o1: Tensor, l1: Tensor, o2: Tensor, l2: Tensor) -> Tensor:
    """Two partial attentions (outputs ``[1, H, L, D]``, natural-log LSEs ``[1, H, L]``)."""
    l1, l2 = l1.reshape(o1.shape[:3]).float(), l2.reshape(o2.shape[:3]).float()
    top = torch.maximum(l1, l2)
    w1, w2 = torch.exp(l1 - top), torch.exp(l2 - top)
    out = (o1.float() * w1[..., None] + o2.float() * w2[..., None]) / (w1 + w2)[..., None]
    return out.to(o1.dtype)


# --- parts --------------------------------------------------------------------------------
def part_env(p: Probe) -> None:
    import torch.nn.attention as attn

    info: dict[str, Any] = {"torch": torch.__version__, "python": sys.version.split()[0]}
    if p.device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
        info["cudnn"] = torch.backends.cudnn.version()
        info["cudnn_sdp_enabled"] = torch.backends.cuda.cudnn_sdp_enabled()
    for name in ("list_flash_attention_impls", "current_flash_attention_impl"):
        fn = getattr(attn, name, None)
        info[name] = None if fn is None else str(fn())
    for op in ("_scaled_dot_product_cudnn_attention", "_flash_attention_forward",
               "_cudnn_attention_forward"):  # fmt: skip
        ov = getattr(torch.ops.aten, op, None)
        info[op] = None if ov is None else str(ov.default._schema)[:400]
    try:
        import torch.nn.attention.varlen as varlen

        info["varlen"] = [n for n in dir(varlen) if not n.startswith("_")]
    except ImportError as err:
        info["varlen"] = str(err)
    info["flash_attn4"] = flash_attn4_available(p.device)
    if info["flash_attn4"]:
        from importlib.metadata import version

        t0 = time.perf_counter()
        import flash_attn.cute  # noqa: F401

        info["flash_attn4_version"] = version("flash-attn-4")
        info["flash_attn4_import_s"] = round(time.perf_counter() - t0, 2)
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    p.emit(part="env", **info)


def sdpa_candidates(
    p: Probe, case: Case, ref: Tensor | None, base: dict[str, Any], lens: str
) -> None:
    """SDPA variants of a full causal prefill (no prefix)."""
    num_heads, num_kv_heads, _ = case.heads
    group = num_heads // num_kv_heads
    q_s, k_s, v_s = bhsd(case.q), bhsd(case.k_new), bhsd(case.v_new)  # strided views
    q_c = q_s.contiguous()
    k_c, v_c = expand(k_s.contiguous(), group), expand(v_s.contiguous(), group)
    scale = case.scale
    for name, backend in BACKENDS.items():

        def run(q: Tensor, k: Tensor, v: Tensor, gqa: bool, b: SDPBackend = backend) -> Tensor:
            with sdpa_kernel(b):
                out = F.scaled_dot_product_attention(
                    q, k, v, is_causal=True, scale=scale, enable_gqa=gqa
                )
            return tokens_first(out)

        p.measure(case.flops, partial(run, q_c, k_c, v_c, False), ref,
                  **base, kind=f"sdpa-{name}", variant="expanded-contig")  # fmt: skip
        p.measure(case.flops, partial(run, q_s, k_s, v_s, True), ref,
                  **base, kind=f"sdpa-{name}", variant="gqa-strided")  # fmt: skip
        if name == "cudnn":
            p.measure(case.flops, partial(run, q_s, expand(k_s, group), expand(v_s, group), False),
                      ref, **base, kind="sdpa-cudnn", variant="expanded-qstrided")  # fmt: skip
    for name, fn in (("cudnn", cudnn_lse), ("flash", flash_lse)):
        p.measure(case.flops, lambda f=fn: tokens_first(f(q_c, k_c, v_c, True, scale)[0]), ref,
                  **base, kind=f"lse-{name}", variant="expanded-contig")  # fmt: skip
    k_t = case.k_new.repeat_interleave(group, 1) if group > 1 else case.k_new
    v_t = case.v_new.repeat_interleave(group, 1) if group > 1 else case.v_new
    p.measure(case.flops, lambda: cudnn_varlen(case.q, k_t, v_t, True, scale)[0], ref,
              **base, kind="cudnn-varlen", variant="thd-expanded")  # fmt: skip
    if p.device.type == "cuda":
        try:
            lse = cudnn_lse(q_c, k_c, v_c, True, scale)[1]
            p.emit(**base, kind="lse-cudnn-shape", shape=list(lse.shape), dtype=str(lse.dtype),
                   stride=list(lse.stride()))  # fmt: skip
        except Exception as exc:
            p.emit(**base, kind="lse-cudnn-shape", error=str(exc)[:200])


def part_full(p: Probe, heads: tuple[int, int, int], sizes: list[int], label: str) -> None:
    for n in sizes:
        case = Case(p, heads, 0, p.k(n))
        base = {"part": label, "heads": "/".join(map(str, heads)), "prefix": 0, "chunk": case.chunk}
        ref = paged_candidates(p, case, base)
        sdpa_candidates(p, case, ref, base, f"{n}k")
        if heads == GEMMA:
            window_candidates(p, case, base)
        del case, ref


def paged_candidates(
    p: Probe, case: Case, base: dict[str, Any], window: int = 0, flops: float | None = None
) -> Tensor | None:
    """The Triton paged kernel (the reference, returned), the engine's path and, where
    installed, FlashAttention-4, in a layer with this sliding window (0: none)."""
    flops = case.flops if flops is None else flops
    ref = p.measure(flops, partial(case.triton, window), None, **base, kind="triton-paged")
    p.measure(flops, partial(case.engine, window), ref, **base, kind="engine")
    if flash_attn4_available(p.device):
        p.measure(flops, partial(flash4, case, window), ref, **base, kind="flash4")
    return ref


def window_candidates(p: Probe, case: Case, base: dict[str, Any]) -> None:
    """Sliding windows (Gemma 3 1B's 512, the larger Gemmas' 1,024): ``paged_candidates``
    with FlashAttention-4's local mask."""
    for window in [512, 1024] if not p.small else [16]:
        seen = sum(min(case.prefix + i + 1, window) for i in range(case.chunk))
        flops = 4 * case.heads[0] * case.heads[2] * seen
        paged_candidates(p, case, {**base, "variant": f"window{window}"}, window, flops)


def prefix_candidates(p: Probe, case: Case, ref: Tensor | None, base: dict[str, Any]) -> None:
    from torch.nn.attention.bias import causal_lower_right

    num_heads, num_kv_heads, head_dim = case.heads
    group = num_heads // num_kv_heads
    scale = case.scale
    bytes_kv = 2 * case.total * num_kv_heads * head_dim * case.q.element_size()
    ms = p.time_ms(partial(case.gather, case.total))
    p.emit(**base, kind="gather", ms=round(ms, 3), gb_s=round(2 * bytes_kv / ms / 1e6, 1))
    blocks = case.long_rows[0].blocks  # the engine's gather (one Triton pass on a GPU)
    ms = p.time_ms(partial(gather_kv, case.k_pool, case.v_pool, blocks, case.total, case.q.dtype))
    p.emit(**base, kind="gather-engine", ms=round(ms, 3), gb_s=round(2 * bytes_kv / ms / 1e6, 1))
    k_full, v_full = case.gather(case.total)
    q_c = bhsd(case.q).contiguous()
    for name, backend in BACKENDS.items():

        def lower_right(b: SDPBackend = backend) -> Tensor:
            bias = causal_lower_right(case.chunk, case.total)
            with sdpa_kernel(b):
                out = F.scaled_dot_product_attention(
                    q_c, k_full, v_full, attn_mask=bias, scale=scale, enable_gqa=True
                )
            return tokens_first(out)

        def lower_right_expanded(b: SDPBackend = backend) -> Tensor:
            bias = causal_lower_right(case.chunk, case.total)
            with sdpa_kernel(b):
                out = F.scaled_dot_product_attention(
                    q_c, expand(k_full, group), expand(v_full, group), attn_mask=bias, scale=scale
                )
            return tokens_first(out)

        p.measure(case.flops, lower_right, ref, **base, kind=f"lowerright-{name}", variant="gqa")
        p.measure(case.flops, lower_right_expanded, ref, **base, kind=f"lowerright-{name}",
                  variant="expanded")  # fmt: skip

    # cuDNN's is_causal when the queries are fewer than the keys: which alignment?
    def cudnn_causal_rect() -> Tensor:
        return tokens_first(cudnn_lse(q_c, expand(k_full, group), expand(v_full, group),
                                      True, scale)[0])  # fmt: skip

    p.measure(case.flops, cudnn_causal_rect, ref, **base, kind="cudnn-is_causal-rect")
    k_thd = expand(k_full, group)[0].transpose(0, 1)
    v_thd = expand(v_full, group)[0].transpose(0, 1)
    p.measure(case.flops, lambda: cudnn_varlen(case.q, k_thd, v_thd, True, scale)[0], ref,
              **base, kind="cudnn-varlen-rect")  # fmt: skip

    # Split: the chunk against itself (causal) + against the prefix (no mask), merged.
    k_self, v_self = expand(bhsd(case.k_new).contiguous(), group), None
    v_self = expand(bhsd(case.v_new).contiguous(), group)
    lse_fns = [("cudnn", cudnn_lse), ("flash", flash_lse)]
    if p.small:
        lse_fns.append(("math", math_lse))
    for name, fn in lse_fns:

        def split(f: Callable[..., tuple[Tensor, Tensor]] = fn, fold: bool = True) -> Tensor:
            k_pre, v_pre = case.gather(case.prefix)
            o1, l1 = f(q_c, k_self, v_self, True, scale)
            if fold:  # GQA folded into the query rows: [1, Hkv, G * C, D], no key copies
                qf = q_c.view(num_kv_heads, group * case.chunk, head_dim)[None]
                o2, l2 = f(qf, k_pre, v_pre, False, scale)
                o2 = o2.view(1, num_heads, case.chunk, head_dim)
                l2 = l2.reshape(1, num_heads, case.chunk)
            else:
                o2, l2 = f(q_c, expand(k_pre, group), expand(v_pre, group), False, scale)
            return tokens_first(merge(o1, l1, o2, l2))

        p.measure(case.flops, split, ref, **base, kind=f"split-{name}", variant="fold")
        p.measure(case.flops, partial(split, fn, False), ref, **base, kind=f"split-{name}",
                  variant="expanded")  # fmt: skip

    # The pieces of the cuDNN split, timed apart.
    k_pre, v_pre = case.gather(case.prefix)
    qf = q_c.view(num_kv_heads, group * case.chunk, head_dim)[None]
    flops_self = 4 * num_heads * head_dim * case.chunk * (case.chunk + 1) / 2
    flops_pre = 4 * num_heads * head_dim * case.chunk * case.prefix
    p.measure(flops_self, lambda: tokens_first(cudnn_lse(q_c, k_self, v_self, True, scale)[0]),
              None, **base, kind="piece-cudnn-self")  # fmt: skip
    p.measure(flops_pre, lambda: cudnn_lse(qf, k_pre, v_pre, False, scale)[0], None, **base,
              kind="piece-cudnn-prefix-fold")  # fmt: skip
    o1, l1 = (math_lse if p.small else cudnn_lse)(q_c, k_self, v_self, True, scale)
    ms = p.time_ms(lambda: merge(o1, l1, o1, l1))
    p.emit(**base, kind="piece-merge-torch", ms=round(ms, 3))


def part_prefix(p: Probe, heads: tuple[int, int, int], shapes: list[tuple[int, int]], label: str):
    for chunk, prefix in shapes:
        case = Case(p, heads, p.k(prefix), p.k(chunk))
        base = {"part": label, "heads": "/".join(map(str, heads)), "prefix": case.prefix,
                "chunk": case.chunk}  # fmt: skip
        ref = paged_candidates(p, case, base)
        prefix_candidates(p, case, ref, base)
        if heads == GEMMA:
            window_candidates(p, case, base)
        del case, ref


def part_flex(p: Probe) -> None:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    for chunk, prefix in ((8, 0), (8, 24)):
        case = Case(p, LLAMA, p.k(prefix), p.k(chunk))
        ref = case.triton()
        offset = case.prefix

        def causal(b: Any, h: Any, q_idx: Any, kv_idx: Any, off: int = offset) -> Any:
            return q_idx + off >= kv_idx

        t0 = time.perf_counter()
        mask = create_block_mask(causal, 1, 1, case.chunk, case.total, device=str(p.device))
        k_full, v_full = case.gather(case.total)
        q_c = bhsd(case.q).contiguous()

        def run(
            m: Any = mask, q: Tensor = q_c, k: Tensor = k_full, v: Tensor = v_full,
            scale: float = case.scale,
        ) -> Tensor:  # fmt: skip
            out = compiled(q, k, v, block_mask=m, scale=scale, enable_gqa=True)
            return tokens_first(out)

        run()
        p.sync()
        compile_s = time.perf_counter() - t0
        base = {"part": "flex", "heads": "24/8/128", "prefix": case.prefix, "chunk": case.chunk}
        p.measure(case.flops, run, ref, **base, kind="flex", compile_s=round(compile_s, 1))
        del case, ref


def part_decode(p: Probe) -> None:
    """Split-KV counts for long decode rows, graph-replayed (reads HBM: >= 2 GB a call)."""
    if p.device.type != "cuda":
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_kernels import decode_setup, graph_ms
    from infer.kernels.paged_attention import num_kv_splits

    for batch, ctx in ((16, 32768), (1, 131072), (4, 32768)):
        calls, call, _, kv_bytes = decode_setup(batch, ctx)
        default = num_kv_splits(batch, LLAMA[1], ctx, p.device)
        for splits in sorted({1, 2, 3, 4, 6, 8, 16, 32, default}):
            ms = graph_ms([call(num_splits=splits)], min_calls=4)
            p.emit(part="decode", batch=batch, context=ctx, splits=splits,
                   default=splits == default, us=round(ms * 1e3, 1),
                   gb_s=round(kv_bytes / ms / 1e6, 1))  # fmt: skip
        del calls, call
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--small", action="store_true", help="tiny float32 shapes (dry run)")
    parser.add_argument("--budget-s", type=float, default=120.0)
    parser.add_argument("--parts", default="env,full,prefix,decode,gemma,flex")
    parser.add_argument("--kinds", default="", help="comma-separated candidates (default: all)")
    args = parser.parse_args()
    p = Probe(args.out, args.small, args.budget_s, set(filter(None, args.kinds.split(","))))
    torch.manual_seed(0)
    parts = {
        "env": partial(part_env, p),
        "full": partial(part_full, p, LLAMA, [8, 32, 128], "full"),
        "prefix": partial(part_prefix, p, LLAMA,
                          [(8, 24), (16, 16), (16, 48), (8, 120), (16, 112)], "prefix"),
        "gemma": lambda: (part_full(p, GEMMA, [8, 32], "gemma-full"),
                          part_prefix(p, GEMMA, [(8, 24)], "gemma-prefix")),
        "flex": partial(part_flex, p),
        "decode": partial(part_decode, p),
    }  # fmt: skip
    for name in args.parts.split(","):
        p.part(name, parts[name])
    p.emit(part="done", elapsed_s=round(time.perf_counter() - p.start, 1))
    table = summary(p.rows)
    print(table)
    (args.out / "table.md").write_text(table + "\n")


def summary(rows: list[dict[str, Any]]) -> str:
    """Per shape: the best TFLOP/s of each candidate, the engine's path last."""
    best: dict[tuple[str, str, int, int], dict[str, float]] = {}
    for row in rows:
        if "tflops" not in row or "chunk" not in row:
            continue
        shape = (row["part"], row["heads"], row["prefix"], row["chunk"])
        variant = str(row.get("variant", ""))
        kind = row["kind"] + (f"-{variant}" if variant.startswith("window") else "")
        rates = best.setdefault(shape, {})
        rates[kind] = max(rates.get(kind, 0.0), row["tflops"])
    kinds = [*sorted({k for rates in best.values() for k in rates} - {"engine"}), "engine"]
    kinds = [k for k in kinds if not k.startswith(("piece-", "cudnn-"))]
    lines = [
        "| heads | prefix | chunk | " + " | ".join(kinds) + " |",
        "|---|---:|---:|" + "---:|" * len(kinds),
    ]
    for (_, heads, prefix, chunk), rates in best.items():
        cells = [str(rates.get(k, "-")) for k in kinds]
        lines.append(f"| {heads} | {prefix} | {chunk} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
