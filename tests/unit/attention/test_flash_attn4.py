"""Where FlashAttention-4 is installed, a long row is one causal call over its gathered K/V
(tokens first), with the mask aligned to the last key: checked on CPU with a torch stand-in
for the package's kernel."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

import pytest
import torch
from tests.unit.attention.test_long_prefill import SMALL_TILE, make_step, reference
from torch import Tensor

import infer.attention.flash_attn4 as flash_attn4_module
import infer.attention.long_prefill as long_prefill_module
from infer.attention.flash_attn4 import (
    causal_attention,
    flash_attn4_available,
    import_in_background,
)
from infer.attention.long_prefill import attend_row, long_prefill_attention, takes_long_path
from infer.attention.torch_backend import paged_attention_torch
from infer.attention.triton_backend import paged_attention_triton


def test_a_cpu_has_no_flash_attention_4() -> None:
    assert not flash_attn4_available(torch.device("cpu"))


@pytest.mark.parametrize("installed", [True, False])
def test_the_package_is_imported_in_a_thread_of_its_own_where_it_is_used(
    installed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    imported: list[tuple[str, str]] = []
    done = threading.Event()

    def record(name: str) -> None:
        imported.append((name, threading.current_thread().name))
        done.set()

    monkeypatch.setattr(flash_attn4_module, "flash_attn4_available", lambda device: installed)
    monkeypatch.setattr(flash_attn4_module.importlib, "import_module", record)
    import_in_background(torch.device("cuda"))
    assert done.wait(5.0 if installed else 0.1) == installed
    assert imported == ([("flash_attn.cute", "infer-flash-attn4-import")] if installed else [])


def flash_attention_stand_in(
    calls: list[tuple[int, int]],
) -> Callable[[Tensor, Tensor, Tensor, Tensor, float, int], None]:
    """The kernel's contract in torch, recording each call's (queries, keys): keys and values
    tokens first, the mask aligned to the last key, a window of that many keys up to each
    query's own."""

    def stand_in(
        out: Tensor, q: Tensor, k: Tensor, v: Tensor, scale: float, window: int = 0
    ) -> None:
        assert k.shape[1:] == v.shape[1:] and k.shape[2] == q.shape[-1]  # [L, Hkv, D]
        assert k.is_contiguous() and v.is_contiguous()  # no copy on the way in
        calls.append((q.shape[0], k.shape[0]))
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        query = torch.arange(q.shape[0])[:, None] + k.shape[0] - q.shape[0]
        distance = query - torch.arange(k.shape[0])[None, :]
        visible = (distance >= 0) & ((distance < window) if window else True)
        weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        out.copy_(torch.einsum("hqk,khd->qhd", weights, v))

    return stand_in


@pytest.mark.parametrize("heads", [(4, 2), (4, 1)])
def test_long_rows_take_one_causal_call_over_tokens_first_keys(
    heads: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(long_prefill_module, "flash_attn4_available", lambda device: True)
    monkeypatch.setattr(long_prefill_module, "causal_attention", flash_attention_stand_in(calls))
    q, k, v, meta = make_step([(70, 30), (50, 50), (61, 23)], heads)
    assert meta.long_prefill is not None and meta.long_prefill.rest is None
    out = torch.full_like(q, float("nan"))
    long_prefill_attention(out, q, k, v, meta.long_prefill.rows, q.shape[-1] ** -0.5)
    assert calls == [(30, 70), (50, 50), (23, 61)]  # one call a row: its chunk, its context
    torch.testing.assert_close(out, reference(q, k, v, meta), atol=1e-4, rtol=1e-4)


def test_sliding_window_layers_read_only_the_blocks_their_window_reaches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Window 24 over blocks of 16: a row's gather starts at the even block at or before the
    one holding its first query's first visible key."""
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(long_prefill_module, "flash_attn4_available", lambda device: True)
    monkeypatch.setattr(long_prefill_module, "causal_attention", flash_attention_stand_in(calls))
    # a prompt alone; prefixes of 50 (first key 27: block 1, from 0), 90 (67: block 4) and
    # 120 (97: block 6), beside a decode row and a short chunk that the Triton kernel keeps
    specs = [(30, 30), (80, 30), (120, 30), (40, 1), (150, 30), (30, 5)]
    q, k, v, meta = make_step(specs, (4, 2))
    assert meta.long_prefill is not None and meta.long_prefill.rest is not None
    window, scale = 24, q.shape[-1] ** -0.5
    assert takes_long_path(q.to(torch.bfloat16), window)
    out = paged_attention_triton(
        q, k, v, meta.long_prefill.rest, scale, window, prefill_tile=SMALL_TILE
    )
    long_prefill_attention(out, q, k, v, meta.long_prefill.rows, scale, sliding_window=window)
    assert calls == [(30, 30), (30, 80), (30, 120 - 64), (30, 150 - 96)]
    expected = paged_attention_torch(q, k, v, meta, scale, window)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_without_flash_attention_4_a_window_is_refused_not_ignored() -> None:
    q = torch.zeros(4, 2, 8)
    with pytest.raises(ValueError, match="window: 16 needs FlashAttention-4"):
        attend_row(torch.empty_like(q), q, q[:, :1].transpose(0, 1), q[:, :1].transpose(0, 1),
                   0, 1.0, window=16)  # fmt: skip


def test_a_broken_install_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # what a failed import leaves
    q = torch.zeros(2, 4, 8)
    with pytest.raises(RuntimeError, match="flash-attn-4 is installed but does not import"):
        causal_attention(torch.empty_like(q), q, q[:, :2], q[:, :2], 1.0)
