"""The batched sampler on the GPU: ``logit_bias`` rows beside plain, seeded and penalised
rows give the tokens the CPU gives, and the bias applies to its own row only."""

from __future__ import annotations

import pytest
import torch

from infer.engine.request import Request
from infer.engine.sampler import SamplingBatch, sample
from infer.engine.sampling_params import SamplingParams

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
