"""Where FlashAttention-4 is installed, a long row is one causal call over its gathered K/V
(tokens first), with the mask aligned to the last key: checked on CPU with a torch stand-in
for the package's kernel."""

from __future__ import annotations

import sys
import threading

import pytest
import torch
from tests.unit.attention.test_long_prefill import make_step, reference

import infer.attention.flash_attn4 as flash_attn4_module
import infer.attention.long_prefill as long_prefill_module
from infer.attention.flash_attn4 import (
    causal_attention,
    flash_attn4_available,
    import_in_background,
)
from infer.attention.long_prefill import attention_with_lse_torch, long_prefill_attention


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


@pytest.mark.parametrize("heads", [(4, 2), (4, 1)])
def test_long_rows_take_one_causal_call_over_tokens_first_keys(
    heads: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, int]] = []

    def stand_in(
        out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
    ) -> None:
        assert k.shape[1:] == v.shape[1:] == (heads[1], q.shape[-1])  # [L, Hkv, D]
        assert k.is_contiguous() and v.is_contiguous()  # no copy on the way in
        calls.append((q.shape[0], k.shape[0]))
        as_heads = [x.transpose(0, 1)[None] for x in (q, k, v)]
        own, _ = attention_with_lse_torch(*as_heads, True, scale)
        out.copy_(own[0].transpose(0, 1))

    monkeypatch.setattr(long_prefill_module, "flash_attn4_available", lambda device: True)
    monkeypatch.setattr(long_prefill_module, "causal_attention", stand_in)
    q, k, v, meta = make_step([(70, 30), (50, 50), (61, 23)], heads)
    assert meta.long_prefill is not None and meta.long_prefill.rest is None
    out = torch.full_like(q, float("nan"))
    long_prefill_attention(out, q, k, v, meta.long_prefill.rows, q.shape[-1] ** -0.5)
    assert calls == [(30, 70), (50, 50), (23, 61)]  # one call a row: its chunk, its context
    torch.testing.assert_close(out, reference(q, k, v, meta), atol=1e-4, rtol=1e-4)


def test_a_broken_install_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # what a failed import leaves
    q = torch.zeros(2, 4, 8)
    with pytest.raises(RuntimeError, match="flash-attn-4 is installed but does not import"):
        causal_attention(torch.empty_like(q), q, q[:, :2], q[:, :2], 1.0)
