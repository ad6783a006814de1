"""Batched sampling: greedy, seeds independent of the batch, filters, penalties, logprobs."""

from __future__ import annotations

import pytest
import torch

from infer.contract.sampling_params import SamplingParams
from infer.engine.core.request import Request
from infer.engine.core.sampler import SamplingBatch, sample
from infer.kernels.sampling import sample_filtered_torch
from infer.kernels.sampling_triton import sample_filtered_triton

VOCAB = 50


def _request(
    params: SamplingParams,
    seed: int = 0,
    output: list[int] | None = None,
    prompt: list[int] | None = None,
) -> Request:
    prompt = prompt or [1, 2, 3]
    return Request("r", prompt + (output or []), len(prompt), params, seed, frozenset({0}))


def _sample(logits: torch.Tensor, requests: list[Request]):  # type: ignore[no-untyped-def]
    batch = SamplingBatch.from_requests(requests, VOCAB, torch.device("cpu"))
    return sample(logits.clone(), batch)  # bias and penalties change the logits in place


def test_greedy_is_argmax() -> None:
    logits = torch.randn(4, VOCAB)
    out = _sample(logits, [_request(SamplingParams(temperature=0))] * 4)
    assert out.token_ids.tolist() == logits.argmax(-1).tolist()


def test_a_seeded_request_samples_the_same_tokens_whatever_the_batch() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, VOCAB)
    params = SamplingParams(temperature=1.0)
    alone = _sample(logits[1:2], [_request(params, seed=7)]).token_ids.item()
    others = [_request(params, seed=1), _request(params, seed=7), _request(params, seed=2)]
    assert _sample(logits, others).token_ids[1].item() == alone


@pytest.mark.parametrize("batch", range(1, 9))
def test_every_setting_starts_16_byte_aligned_whatever_the_batch(batch: int) -> None:
    """Triton compiles a variant of the sampling kernel per pointer alignment: one layout
    for every batch size means one variant, built by the warm-up."""
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=5, min_p=0.1)
    rows = SamplingBatch.from_requests([_request(params)] * batch, VOCAB, torch.device("cpu")).rows
    settings = [rows.temperature, rows.top_k, rows.top_p, rows.min_p, rows.seeds, rows.steps]
    assert all(t.data_ptr() % 16 == 0 and t.shape == (batch,) for t in settings)
    assert rows.top_p.tolist() == pytest.approx([0.9] * batch)
    assert rows.top_k.tolist() == [5] * batch


def test_samples_follow_the_distribution() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2] + [0.0] * (VOCAB - 3)]) + 1e-30)
    requests = [_request(SamplingParams(temperature=1.0), seed=s) for s in range(3000)]
    tokens = _sample(logits.expand(3000, -1), requests).token_ids
    freq = torch.bincount(tokens, minlength=3)[:3].float() / 3000
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.3, 0.2]), atol=0.04, rtol=0)


def test_top_k_top_p_and_min_p_restrict_the_candidates() -> None:
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1] + [0.0] * (VOCAB - 4))
    logits = torch.log(probs + 1e-30).expand(500, -1)
    cases = [
        (SamplingParams(top_k=2), {0, 1}),
        (SamplingParams(top_p=0.65), {0, 1}),  # 0.4 + 0.3 reaches 0.65
        (SamplingParams(top_p=0.01), {0}),
        (SamplingParams(min_p=0.6), {0, 1}),  # p >= 0.6 * 0.4
    ]
    for params, allowed in cases:
        tokens = _sample(logits, [_request(params, seed=s) for s in range(500)]).token_ids
        assert set(tokens.tolist()) == allowed, params


def test_greedy_and_sampled_rows_mix() -> None:
    logits = torch.randn(2, VOCAB)
    out = _sample(
        logits,
        [
            _request(SamplingParams(temperature=0)),
            _request(SamplingParams(temperature=1.0, top_k=1)),
        ],
    )
    assert out.token_ids.tolist() == logits.argmax(-1).tolist()


def test_penalties_push_down_tokens_already_used() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 5], logits[0, 6] = 2.0, 1.9
    repeat = _request(SamplingParams(temperature=0, repetition_penalty=2.0), output=[5])
    assert _sample(logits, [repeat]).token_ids.item() == 6  # 2.0 / 2 < 1.9
    presence = _request(SamplingParams(temperature=0, presence_penalty=0.5), output=[5])
    assert _sample(logits, [presence]).token_ids.item() == 6
    logits[0, 6] = 1.0
    frequency = _request(SamplingParams(temperature=0, frequency_penalty=0.4), output=[5, 5, 5])
    assert _sample(logits, [frequency]).token_ids.item() == 6  # 2.0 - 1.2 < 1.0
    logits[0, 6] = 1.5
    from_prompt = _request(SamplingParams(temperature=0, repetition_penalty=2.0), prompt=[5])
    assert _sample(logits, [from_prompt]).token_ids.item() == 6


def test_min_tokens_bans_stop_tokens_until_reached() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 0] = 10.0  # EOS is by far the most likely
    early = _request(SamplingParams(temperature=0, min_tokens=2), output=[7])
    assert _sample(logits, [early]).token_ids.item() != 0
    done = _request(SamplingParams(temperature=0, min_tokens=2), output=[7, 7])
    assert _sample(logits, [done]).token_ids.item() == 0


def test_logprobs_of_the_sampled_token_and_the_top_alternatives() -> None:
    logits = torch.randn(2, VOCAB)
    out = _sample(logits, [_request(SamplingParams(temperature=0, logprobs=3))] * 2)
    expected = logits.log_softmax(-1)
    assert out.logprobs is not None and out.top_ids is not None
    assert out.top_logprobs is not None
    torch.testing.assert_close(out.logprobs, expected.max(-1).values)
    assert out.top_ids[:, 0].tolist() == logits.argmax(-1).tolist()
    assert (out.top_logprobs[:, :-1] >= out.top_logprobs[:, 1:]).all()


def test_logit_bias_bans_and_forces_tokens_of_its_own_row_only() -> None:
    logits = torch.zeros(3, VOCAB)
    logits[:, 4] = 5.0  # everyone's favourite
    banned = _request(SamplingParams(temperature=0, logit_bias={4: -100.0}))
    forced = _request(SamplingParams(temperature=1.0, logit_bias={9: 100.0}), seed=3)
    plain = _request(SamplingParams(temperature=0))
    out = _sample(logits, [banned, forced, plain])
    assert out.token_ids.tolist()[1:] == [9, 4]
    assert out.token_ids[0].item() != 4


def test_logit_bias_is_added_to_the_logits_before_sampling() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 1], logits[0, 2] = 3.0, 2.0
    nudged = _request(SamplingParams(temperature=0, logit_bias={2: 1.5, 1: -0.1}))
    assert _sample(logits, [nudged]).token_ids.item() == 2  # 3.0 - 0.1 < 2.0 + 1.5
    penalised = _request(
        SamplingParams(temperature=0, logit_bias={2: 0.5}, repetition_penalty=2.0), output=[2]
    )
    assert _sample(logits, [penalised]).token_ids.item() == 1  # (2.0 + 0.5) / 2 < 3.0
    requests = [_request(SamplingParams(logit_bias={7: 100.0}), seed=s) for s in range(50)]
    assert set(_sample(logits.expand(50, -1), requests).token_ids.tolist()) == {7}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 0),
        ("temperature", -1.0),
        ("top_p", 0.0),
        ("top_k", -2),
        ("min_p", 1.5),
        ("repetition_penalty", 0.0),
        ("presence_penalty", 3.0),
        ("frequency_penalty", -3.0),
        ("seed", -1),
        ("max_tokens", 0),
        ("min_tokens", -1),
        ("logprobs", 21),
        ("stop", [""]),
        ("stop_token_ids", [-1]),
        ("logit_bias", {-1: 1.0}),
        ("logit_bias", {5: 100.5}),
        ("logit_bias", {5: float("nan")}),
        ("temperature", float("inf")),
        ("top_p", float("nan")),
        ("presence_penalty", float("-inf")),
    ],
)
def test_invalid_sampling_params_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"^{field}:"):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_k", VOCAB + 1),
        ("top_k", 2**63),
        ("stop_token_ids", [VOCAB]),
        ("stop_token_ids", [10**9]),
        ("logit_bias", {VOCAB: 1.0}),
        ("min_tokens", 64),
    ],
)
def test_limits_of_the_model_name_the_field(field: str, value: object) -> None:
    params = SamplingParams(**{"max_tokens": None, field: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=f"^{field}:"):
        params.check_for_model(VOCAB, max_seq_len=64)


def test_the_edges_of_the_model_are_allowed() -> None:
    SamplingParams(
        top_k=VOCAB, stop_token_ids=[VOCAB - 1], logit_bias={0: -100, VOCAB - 1: 100},
        max_tokens=63, min_tokens=63,
    ).check_for_model(VOCAB, max_seq_len=64)  # fmt: skip


def test_min_tokens_cannot_exceed_max_tokens() -> None:
    with pytest.raises(ValueError, match=r"^min_tokens:"):
        SamplingParams(max_tokens=2, min_tokens=3)
    assert SamplingParams(stop="x").stop == ["x"]


def test_the_kernel_reads_the_settings_the_batch_builds() -> None:
    """Each setting reaches the Triton kernel as its own contiguous row (under
    TRITON_INTERPRET on a CPU): the kernel draws the reference's tokens."""
    torch.manual_seed(2)
    params = [
        SamplingParams(temperature=0.7, top_p=0.8),
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.0, top_k=3),
        SamplingParams(temperature=1.2, min_p=0.1),
        SamplingParams(temperature=0.9, top_p=0.5, top_k=10),
    ]
    requests = [_request(p, seed=11 * i) for i, p in enumerate(params)]
    batch = SamplingBatch.from_requests(requests, VOCAB, torch.device("cpu"))
    logits = torch.randn(len(params), VOCAB) * 2
    expected = sample_filtered_torch(logits, batch.rows, batch.mask)
    assert torch.equal(sample_filtered_triton(logits, batch.rows, batch.mask), expected)
