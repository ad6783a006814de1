"""Filtered sampling: each filter samples exactly its filtered softmax (chi-square against an
independent sort-based reference), never leaves the allowed set, and a seeded row draws the
same token whatever shares its batch; the Triton kernel draws the reference's tokens."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
import triton
import triton.language as tl
from tests.conftest import chi_square_critical

from infer.kernels.sampling import (
    RowSettings,
    TokenMask,
    sample_filtered_torch,
    uniform_noise,
    unpack_mask,
)
from infer.kernels.sampling_triton import _kth_largest, sample_filtered_triton

VOCAB = 24
DRAWS = 6000
Sampler = Callable[[torch.Tensor, RowSettings, TokenMask | None], torch.Tensor]


def _on_gpu(logits: torch.Tensor, rows: RowSettings, mask: TokenMask | None) -> torch.Tensor:
    """The Triton kernel compiled for the GPU, on CPU tensors."""
    cuda = torch.device("cuda")
    moved = dataclasses.replace(rows, **{f: getattr(rows, f).to(cuda) for f in _TENSOR_FIELDS})
    on_device = None if mask is None else TokenMask(mask.bits.to(cuda), mask.rows.to(cuda))
    return sample_filtered_triton(logits.to(cuda), moved, on_device).cpu()


_TENSOR_FIELDS = ("temperature", "top_k", "top_p", "min_p", "seeds", "steps")
SAMPLERS = [
    pytest.param(sample_filtered_torch, id="torch"),
    pytest.param(
        _on_gpu,
        id="triton",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
        ],
    ),
]


def _settings(
    rows: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> RowSettings:
    k = top_k or VOCAB
    return RowSettings(
        temperature=torch.full((rows,), temperature),
        top_k=torch.full((rows,), k, dtype=torch.int64),
        top_p=torch.full((rows,), top_p),
        min_p=torch.full((rows,), min_p),
        seeds=torch.arange(rows, dtype=torch.int64) * 1_000_003 + 11,
        steps=torch.full((rows,), 3, dtype=torch.int64),
        use_top_k=k < VOCAB,
        use_top_p=top_p < 1.0,
    )


def _expected(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float
) -> torch.Tensor:
    """The filtered softmax, by sorting: min-p, then top-k, then top-p over what is left."""
    probs = (logits / temperature).softmax(-1)
    probs = torch.where(probs >= min_p * probs.max(), probs, 0.0)
    ordered, order = probs.sort(descending=True)
    keep = torch.arange(len(probs)) < (top_k or len(probs))
    ordered = torch.where(keep, ordered, 0.0)
    ordered = ordered / ordered.sum()
    keep &= (ordered.cumsum(0) - ordered) < top_p  # mass strictly before each token
    kept = torch.zeros_like(probs).scatter(0, order, torch.where(keep, ordered, 0.0))
    return kept / kept.sum()


FILTERS = [
    pytest.param(1.0, 0, 1.0, 0.0, id="temperature-1"),
    pytest.param(0.6, 0, 1.0, 0.0, id="temperature-0.6"),
    pytest.param(1.0, 5, 1.0, 0.0, id="top-k"),
    pytest.param(1.0, 0, 0.7, 0.0, id="top-p"),
    pytest.param(1.5, 0, 0.4, 0.0, id="top-p-small"),
    pytest.param(1.0, 0, 1.0, 0.1, id="min-p"),
    pytest.param(1.2, 8, 0.8, 0.02, id="all-three"),
]


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize(("temperature", "top_k", "top_p", "min_p"), FILTERS)
def test_samples_follow_the_filtered_softmax(
    sampler: Sampler, temperature: float, top_k: int, top_p: float, min_p: float
) -> None:
    torch.manual_seed(1)
    logits = torch.randn(VOCAB) * 1.5
    expected = _expected(logits, temperature, top_k, top_p, min_p)
    rows = _settings(DRAWS, temperature, top_k, top_p, min_p)
    tokens = sampler(logits.expand(DRAWS, -1).contiguous(), rows, None)
    counts = torch.bincount(tokens, minlength=VOCAB).double()
    assert (counts[expected == 0] == 0).all(), "a filtered-out token was sampled"
    support = expected > 0
    assert support.sum() > 1
    mean = expected[support].double() * DRAWS
    statistic = float(((counts[support] - mean) ** 2 / mean).sum())
    assert statistic < chi_square_critical(int(support.sum()) - 1)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_mask_keeps_samples_inside_the_allowed_tokens(sampler: Sampler) -> None:
    logits = torch.randn(1, VOCAB).expand(500, -1)
    allowed = [3, 7, 8, 20]
    bits = torch.tensor([[sum(1 << t for t in allowed)]], dtype=torch.int32)
    mask = TokenMask(bits, torch.zeros(500, dtype=torch.int32))
    tokens = sampler(logits.contiguous(), _settings(500, top_k=3, top_p=0.9), mask)
    assert set(tokens.tolist()) <= set(allowed) and len(set(tokens.tolist())) > 1


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_top_k_keeps_every_token_tied_with_the_kth(sampler: Sampler) -> None:
    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0] + [0.0] * (VOCAB - 4)]).expand(400, -1)
    tokens = sampler(logits.contiguous(), _settings(400, top_k=2), None)
    assert set(tokens.tolist()) == {0, 1, 2, 3}
    flat = torch.randn(1, VOCAB).expand(400, -1) * 0.01
    only = sampler(flat.contiguous(), _settings(400, top_k=1), None)
    assert set(only.tolist()) == {int(flat[0].argmax())}


def test_greedy_rows_take_the_argmax_within_their_mask() -> None:
    logits = torch.randn(2, VOCAB)
    rows = RowSettings.greedy(2, torch.device("cpu"))
    assert sample_filtered_torch(logits, rows, None).tolist() == logits.argmax(-1).tolist()
    bits = torch.tensor([[0b1010]], dtype=torch.int32)
    masked = sample_filtered_torch(logits, rows, TokenMask(bits, torch.tensor([0, -1])))
    best = 1 if logits[0, 1] > logits[0, 3] else 3
    assert masked.tolist() == [best, int(logits[1].argmax())]


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_seeded_row_samples_the_same_token_whatever_the_batch(sampler: Sampler) -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, VOCAB)
    alone = _settings(1, top_p=0.8)
    alone.seeds[0] = 7
    batch = _settings(3, top_p=0.8)
    batch.seeds[1] = 7
    for _ in range(5):
        batch.steps += 1
        alone.steps += 1
        together = sampler(logits, batch, None)
        assert together[1] == sampler(logits[1:2].contiguous(), alone, None)[0]


def test_each_step_and_round_draws_fresh_noise() -> None:
    seeds, steps = torch.tensor([5, 5]), torch.tensor([0, 1])
    noise = uniform_noise(seeds, steps, VOCAB)
    assert not torch.equal(noise[0], noise[1])
    assert not torch.equal(noise, uniform_noise(seeds, steps, VOCAB, round_=1))
    assert ((noise > 0) & (noise < 1)).all()


def test_a_token_bitmask_unpacks_to_exactly_the_tokens_whose_bit_is_set() -> None:
    """Bit ``t % 32`` of word ``t // 32`` is token ``t``; the vocabulary ends mid-word; rows
    without a mask (-1) allow everything."""
    vocab = 77
    bits = torch.randint(-(2**31), 2**31 - 1, (3, 3), dtype=torch.int32)
    rows = torch.tensor([0, -1, 2, 1], dtype=torch.int32)
    expected = torch.ones(4, vocab, dtype=torch.bool)
    for i, k in enumerate(rows.tolist()):
        for t in range(vocab if k >= 0 else 0):
            expected[i, t] = bool((int(bits[k, t // 32]) >> (t % 32)) & 1)
    assert torch.equal(unpack_mask(TokenMask(bits, rows), vocab), expected)


def test_the_triton_kernel_draws_the_reference_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every filter and a mask at once (under TRITON_INTERPRET on a CPU: few rows). Blocks
    of 64 cut a row into five, the last one partial: every pass loops over blocks and masks
    the vocabulary's end, and top-k selects among 4 x 64 lane values (4 x 1024 at the default
    block)."""
    import infer.kernels.sampling_triton as kernel

    monkeypatch.setattr(kernel, "_MAX_BLOCK", 64)
    torch.manual_seed(3)
    vocab, count = 300, 12
    logits = torch.randn(count, vocab) * 2
    rows = RowSettings(
        temperature=torch.tensor([0.0, 1.0, 0.7, 1.0, 1.0, 0.9] * 2),
        top_k=torch.tensor([vocab, vocab, vocab, 40, 1, 25] * 2),
        top_p=torch.tensor([1.0, 1.0, 0.9, 1.0, 1.0, 0.6] * 2),
        min_p=torch.tensor([0.0, 0.2, 0.0, 0.0, 0.0, 0.05] * 2),
        seeds=torch.arange(count, dtype=torch.int64) * 977,
        steps=torch.arange(count, dtype=torch.int64),
        use_top_k=True,
        use_top_p=True,
    )
    bits = torch.randint(-(2**31), 2**31 - 1, (2, (vocab + 31) // 32), dtype=torch.int32)
    mask = TokenMask(bits, torch.tensor([-1] * 6 + [0, 1] * 3, dtype=torch.int32))
    expected = sample_filtered_torch(logits, rows, mask)
    assert torch.equal(sample_filtered_triton(logits, rows, mask), expected)


def test_top_k_counts_again_when_one_lane_holds_more_than_four_of_the_largest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lane of the kernel keeps its four largest values; where one lane holds more of the
    row's largest (here every 16th token, with blocks of 16), the kernel's counting passes
    must find the k-th largest instead (under TRITON_INTERPRET on a CPU, blocks of 16: ten
    blocks, the last one partial, and a sort of 4 x 16 lane values)."""
    import infer.kernels.sampling_triton as kernel

    monkeypatch.setattr(kernel, "_MAX_BLOCK", 16)
    torch.manual_seed(5)
    vocab, count = 150, 6
    logits = torch.randn(count, vocab)
    logits[:, ::16] += 8.0  # ten large values, all in lane 0
    logits[1, 32] = logits[1, 16]  # a tie at the k-th largest
    rows = RowSettings(
        temperature=torch.ones(count),
        top_k=torch.tensor([3, 6, 9, 12, 40, 7]),
        top_p=torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.8]),
        min_p=torch.zeros(count),
        seeds=torch.arange(count, dtype=torch.int64),
        steps=torch.zeros(count, dtype=torch.int64),
        use_top_k=True,
        use_top_p=True,
    )
    for step in range(4):
        rows.steps.fill_(step)
        expected = sample_filtered_torch(logits, rows, None)
        assert torch.equal(sample_filtered_triton(logits, rows, None), expected)


@triton.jit
def _kth_largest_of_block(values_ptr, k, out_ptr, SIZE: tl.constexpr):
    tl.store(out_ptr, _kth_largest(tl.load(values_ptr + tl.arange(0, SIZE)), k))


def test_the_kth_largest_lane_value_is_the_sorted_one() -> None:
    """The bisection over the floats' bits picks what a descending sort puts at k - 1:
    repeats counted, negatives, zeros of both signs and -inf (masked tokens) among them."""
    torch.manual_seed(5)
    values = torch.cat([
        torch.randint(-4, 5, (40,)).float() / 2,
        torch.randn(16) * 1e3,
        torch.tensor([float("-inf")] * 5 + [-0.0, 0.0, 1e-30, -1e-30]),
    ])[:64]  # fmt: skip
    ordered = values.sort(descending=True).values
    out = torch.empty(1)
    for k in range(1, 65):
        _kth_largest_of_block[(1,)](values, k, out, SIZE=64)
        assert out.item() == ordered[k - 1].item(), k
