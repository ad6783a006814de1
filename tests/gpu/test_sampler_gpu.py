"""The batched sampler on the GPU: ``logit_bias`` rows beside plain, seeded and penalised
rows give the tokens the CPU gives, and the bias applies to its own row only."""

from __future__ import annotations

import pytest
import torch

from infer.contract.sampling_params import SamplingParams
from infer.engine.core.request import Request
from infer.engine.core.sampler import SamplingBatch, sample
from infer.kernels.argmax import argmax_rows
from infer.kernels.sampling import RowSettings, TokenMask, sample_filtered, sample_filtered_torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
VOCAB = 128256


def test_logit_bias_on_the_device_matches_the_cpu() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, VOCAB) * 4
    favourite = int(logits[0].argmax())
    params = [
        SamplingParams(temperature=0, logit_bias={favourite: -100.0}),
        SamplingParams(temperature=0.8, logit_bias={123: 100.0}),
        SamplingParams(temperature=0.8, top_k=50, logit_bias={7: 5.0, 9: -5.0}),
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.0, top_p=0.9, repetition_penalty=1.3),
        SamplingParams(temperature=0, logit_bias={VOCAB - 1: 100.0}, min_tokens=2),
    ]
    requests = [
        Request(str(i), [1, 2, 3], 3, p, seed=i, eos_token_ids=frozenset({0}))
        for i, p in enumerate(params)
    ]

    def tokens(device: str) -> list[int]:
        batch = SamplingBatch.from_requests(requests, VOCAB, torch.device(device))
        return sample(logits.to(device), batch).token_ids.tolist()

    on_gpu = tokens("cuda")
    assert on_gpu == tokens("cpu")
    assert on_gpu[0] != favourite and on_gpu[1] == 123 and on_gpu[5] == VOCAB - 1
    assert on_gpu[3] == int(logits[3].argmax())


def test_the_kernel_draws_the_reference_tokens_at_a_real_vocabulary() -> None:
    """64 rows of every setting (greedy, temperature, top-k, top-p, min-p, masks) at
    Llama 3's vocabulary: the Triton kernel's tokens are the torch reference's."""
    torch.manual_seed(1)
    rows = 64
    logits = torch.randn(rows, VOCAB) * 3
    settings = RowSettings(
        temperature=torch.tensor([0.0, 1.0, 0.7, 1.0, 0.6, 1.0, 1.2, 0.8] * 8),
        top_k=torch.tensor([VOCAB, VOCAB, VOCAB, 50, VOCAB, 1, 20, 1000] * 8),
        top_p=torch.tensor([1.0, 1.0, 0.9, 1.0, 0.95, 1.0, 0.5, 0.8] * 8),
        min_p=torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.05, 0.01] * 8),
        seeds=torch.arange(rows, dtype=torch.int64) * 7919,
        steps=torch.arange(rows, dtype=torch.int64) % 13,
        use_top_k=True,
        use_top_p=True,
    )
    words = (VOCAB + 31) // 32
    bits = torch.randint(-(2**31), 2**31 - 1, (4, words), dtype=torch.int32)
    mask_rows = torch.tensor([-1, -1, -1, 0, -1, 1, 2, 3] * 8, dtype=torch.int32)
    mask = TokenMask(bits, mask_rows)
    expected = sample_filtered_torch(logits, settings, mask)
    cuda = torch.device("cuda")
    on_gpu = RowSettings(
        *(t.to(cuda) for t in (settings.temperature, settings.top_k, settings.top_p)),
        *(t.to(cuda) for t in (settings.min_p, settings.seeds, settings.steps)),
        True,
        True,
    )
    got = sample_filtered(logits.to(cuda), on_gpu, TokenMask(bits.to(cuda), mask_rows.to(cuda)))
    assert (got.cpu() == expected).float().mean() >= 0.99  # float sums may differ at an edge


def test_batches_of_every_size_share_one_kernel_variant() -> None:
    """The per-row settings start 16-byte aligned whatever the batch, so Triton builds one
    sampling variant for them all (the first burst after ready compiled two more)."""
    from infer.kernels.jit_log import JIT_LOG

    assert JIT_LOG.install()
    params = SamplingParams(temperature=1.0)
    start = len(JIT_LOG.variants)
    for batch in range(1, 9):
        requests = [Request(str(i), [1, 2], 2, params, seed=i) for i in range(batch)]
        rows = SamplingBatch.from_requests(requests, VOCAB, torch.device("cuda"))
        sample(torch.randn(batch, VOCAB, device="cuda", dtype=torch.bfloat16), rows)
    torch.cuda.synchronize()
    built = [v for v in JIT_LOG.variants[start:] if v.name == "_sample_kernel"]
    assert len(built) <= 1, [v.specialization for v in built]


@pytest.mark.parametrize("rows", [1, 256])
def test_the_two_pass_argmax_picks_what_torch_picks_on_the_device(rows: int) -> None:
    torch.manual_seed(rows)
    logits = torch.randint(-3, 4, (rows, VOCAB), device="cuda").to(torch.bfloat16)
    logits[0, VOCAB // 2] = float("nan")
    assert torch.equal(argmax_rows(logits), torch.argmax(logits, dim=-1))
