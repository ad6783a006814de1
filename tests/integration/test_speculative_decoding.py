"""Speculative decoding end to end: n-gram proposals change no greedy or seeded output of
the real SmolLM2 (batch 1 and 8, logprobs, penalties, stop strings, the server), the sampled
distribution is the target's (chi-square, with a proposer that is right about half the
time), and no block is leaked."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from tests.conftest import chi_square_critical
from tests.integration.conftest import metric

from infer import LLM, SamplingParams
from infer.contract.sampling_params import StructuredOutputsParams
from infer.engine.core.request import Request
from infer.engine.speculative.speculation import SpeculationGate
from infer.server import build_server, serve_in_thread

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
QUOTING = [
    "Copy this line exactly: the river rose at dawn and the mill wheel turned twice.\n"
    "Copy: the river rose at dawn and the mill wheel turned twice.\nCopy:",
    "def area(width, height):\n    return width * height\n\n"
    "Rename width to w and height to h:\ndef area(w, h):\n    return",
    "Alice: the train leaves at nine.\nBob: the train leaves at nine?\nAlice: yes, the train",
    "List: apples, pears, plums, apples, pears, plums, apples, pears,",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Numbers: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,",
    "Translate to French: good morning. Bonjour. Translate to French: good night.",
    "Summarise: The committee met on Tuesday. The committee approved the budget.",
]


@pytest.fixture(scope="module")
def speculating_engine() -> Iterator[LLM]:
    yield LLM(
        "smollm2-135m",
        num_gpu_blocks=512,
        max_seq_len=2048,
        max_batch_size=32,
        speculative_config=NGRAM,
    )


@pytest.fixture
def speculating(speculating_engine: LLM) -> LLM:
    """The speculating engine with its gate open, whatever the tests before it gained."""
    spec = speculating_engine.config.speculative_config
    assert spec is not None
    speculating_engine.engine.scheduler.gate = SpeculationGate(spec)
    return speculating_engine


def _outputs(llm: LLM, prompts: list[str], params: SamplingParams) -> list[Any]:
    return [r.outputs[0] for r in llm.generate(prompts, params, use_tqdm=False)]


def _same_tokens(
    plain_llm: LLM, fast_llm: LLM, prompts: list[str], params: SamplingParams
) -> tuple[list[Any], list[Any]]:
    """Both engines' outputs, which must be the same tokens."""
    plain, fast = _outputs(plain_llm, prompts, params), _outputs(fast_llm, prompts, params)
    assert [o.token_ids for o in fast] == [o.token_ids for o in plain]
    return plain, fast


def _assert_no_leaks(llm: LLM) -> None:
    assert llm.engine.pool.audit_blocks() == [] and llm.engine.pool.used_blocks() == 0


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 8])
def test_greedy_outputs_are_those_without_speculation(
    batch: int, smollm2_llm: LLM, speculating: LLM
) -> None:
    params = SamplingParams(temperature=0, max_tokens=32)
    before = speculating.engine.scheduler.speculation.num_accepted_tokens
    for start in range(0, len(QUOTING), batch * 2):  # batch 1: every other prompt
        plain, fast = _same_tokens(smollm2_llm, speculating, QUOTING[start : start + batch], params)
        assert [o.finish_reason for o in fast] == [o.finish_reason for o in plain]
    assert speculating.engine.scheduler.speculation.num_accepted_tokens > before
    _assert_no_leaks(speculating)


@pytest.mark.slow
def test_seeded_samples_and_their_logprobs_are_those_without_speculation(
    smollm2_llm: LLM, speculating: LLM
) -> None:
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=11, max_tokens=24, logprobs=2)
    plain, fast = _same_tokens(smollm2_llm, speculating, QUOTING, params)
    for a, b in zip(fast, plain):
        assert [e.token_id for e in a.logprobs] == [e.token_id for e in b.logprobs]
        for x, y in zip(a.logprobs, b.logprobs):
            assert x.logprob == pytest.approx(y.logprob, abs=1e-4)
            assert x.top.keys() == y.top.keys()
    _assert_no_leaks(speculating)


@pytest.mark.slow
def test_penalised_samples_count_the_proposals_before_them(
    smollm2_llm: LLM, speculating: LLM
) -> None:
    params = SamplingParams(
        temperature=0.7, seed=3, max_tokens=24, repetition_penalty=1.1, frequency_penalty=0.1
    )
    before = speculating.engine.scheduler.speculation.num_accepted_tokens
    _same_tokens(smollm2_llm, speculating, QUOTING, params)
    assert speculating.engine.scheduler.speculation.num_accepted_tokens > before
    _assert_no_leaks(speculating)


@pytest.mark.slow
def test_constrained_rows_follow_their_grammar_through_proposals(
    smollm2_llm: LLM, speculating: LLM
) -> None:
    """Each proposed position samples under the grammar's mask after the proposals before
    it (the prompt also offers "green", which the grammar forbids)."""
    prompt = "Colours: red, green, blue, red, green, blue, red, green, blue, red,"
    constraint = StructuredOutputsParams(regex=r"( (red|blue),)+")
    params = SamplingParams(temperature=0, max_tokens=24, structured_outputs=constraint)
    before = speculating.engine.scheduler.speculation.num_draft_tokens
    (plain,), (fast,) = _same_tokens(smollm2_llm, speculating, [prompt], params)
    assert fast.finish_reason == plain.finish_reason
    assert re.fullmatch(r"( (red|blue),)*( (red|blue)?)?", fast.text) is not None, fast.text
    assert speculating.engine.scheduler.speculation.num_draft_tokens > before
    _assert_no_leaks(speculating)


@pytest.mark.slow
def test_stop_strings_cut_where_they_do_without_speculation(
    smollm2_llm: LLM, speculating: LLM
) -> None:
    params = SamplingParams(temperature=0, max_tokens=60, stop=["twice", "nine"])
    plain = _outputs(smollm2_llm, QUOTING[:3], params)
    fast = _outputs(speculating, QUOTING[:3], params)
    assert [(o.text, o.finish_reason) for o in fast] == [(o.text, o.finish_reason) for o in plain]
    assert any(o.finish_reason == "stop" for o in fast)
    _assert_no_leaks(speculating)


# --- the sampled distribution ----------------------------------------------------------------
PROMPT = [11, 42, 7, 99, 23, 5, 61, 17]
TOP_K = 3
DRAWS = 3000


class _TableProposer:
    """Proposes, after the first output, the most likely second one: the n-gram proposer
    would rarely be right on random weights, and this one is about half the time, so both
    an accepted and a rejected proposal are drawn often."""

    def __init__(self, likeliest: dict[int, int]) -> None:
        self.likeliest = likeliest

    def propose(self, requests: list[Request], limits: list[int]) -> list[list[int]]:
        return [
            [self.likeliest[r.token_ids[-1]]] if r.num_tokens == len(PROMPT) + 1 and limit else []
            for r, limit in zip(requests, limits)
        ]

    def forget(self, request: Request) -> None:
        pass


def _next_token_probabilities(llm: LLM, prefixes: list[list[int]]) -> list[dict[int, float]]:
    """Each prefix's filtered next-token distribution (temperature 1, top-k), from the
    unfiltered top logprobs of a run without speculation."""
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=TOP_K)
    results = llm.generate(prefixes, params, use_tqdm=False)
    tables = []
    for result in results:
        top = result.outputs[0].logprobs[0].top
        total = sum(math.exp(v) for v in top.values())
        tables.append({t: math.exp(v) / total for t, v in top.items()})
    return tables


def test_sampled_outputs_follow_the_targets_distribution(
    tiny_checkpoint: Callable[[str], Path],
) -> None:
    model = str(tiny_checkpoint("llama"))
    options: dict[str, Any] = {"num_gpu_blocks": 2048, "max_seq_len": 64, "max_batch_size": 256}
    plain = LLM(model, **options)
    (first,) = _next_token_probabilities(plain, [PROMPT])
    seconds = dict(zip(first, _next_token_probabilities(plain, [[*PROMPT, a] for a in first])))
    pairs = [(a, b) for a in first for b in seconds[a]]
    thirds = dict(zip(pairs, _next_token_probabilities(plain, [[*PROMPT, *p] for p in pairs])))
    expected = {
        (a, b, c): first[a] * seconds[a][b] * thirds[(a, b)][c]
        for (a, b) in pairs
        for c in thirds[(a, b)]
    }

    llm = LLM(model, **options, speculative_config={"num_speculative_tokens": 1})
    likeliest = {a: max(table, key=table.__getitem__) for a, table in seconds.items()}
    llm.engine.scheduler.proposer = _TableProposer(likeliest)
    params = SamplingParams(temperature=1.0, top_k=TOP_K, max_tokens=3, ignore_eos=True)
    results = llm.generate([PROMPT] * DRAWS, params, use_tqdm=False)
    counts = Counter(tuple(r.outputs[0].token_ids) for r in results)

    assert set(counts) <= set(expected), "a sequence outside the filtered support"
    statistic = sum((counts[seq] - DRAWS * p) ** 2 / (DRAWS * p) for seq, p in expected.items())
    assert statistic < chi_square_critical(len(expected) - 1)
    stats = llm.engine.scheduler.speculation
    assert 0.2 < stats.acceptance_rate < 0.9 and stats.num_verify_steps == DRAWS
    _assert_no_leaks(llm)


@pytest.mark.slow
def test_the_server_speculates_and_reports_acceptance_in_metrics(
    smollm2_llm: LLM, speculating: LLM
) -> None:
    server = build_server(speculating.config, port=0, log_level="warning")
    with serve_in_thread(server) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        reply = client.completions.create(
            model="smollm2-135m", prompt=QUOTING[3], max_tokens=32, temperature=0
        )
        params = SamplingParams(temperature=0, max_tokens=32)
        (plain,) = _outputs(smollm2_llm, [QUOTING[3]], params)
        assert reply.choices[0].text == plain.text
        proposed = metric(url, "infer_spec_decode_num_draft_tokens_total")
        accepted = metric(url, "infer_spec_decode_num_accepted_tokens_total")
        assert 0 < accepted <= proposed
        rate = metric(url, "infer_spec_decode_acceptance_rate")
        assert rate == pytest.approx(accepted / proposed)
        assert metric(url, "infer_spec_decode_mean_accepted_length") > 1


# --- a draft model ---------------------------------------------------------------------------
@pytest.mark.parametrize("draft", ["llama", "qwen3"])
def test_a_draft_model_changes_no_output_and_frees_both_caches(
    draft: str, tiny_checkpoint: Callable[[str], Path]
) -> None:
    target = str(tiny_checkpoint("llama"))
    options: dict[str, Any] = {"num_gpu_blocks": 256, "max_seq_len": 128, "block_size": 4}
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 320, (n,), generator=generator).tolist() for n in (5, 17, 30, 9)]
    params = [
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=1.0, top_k=20, seed=9, max_tokens=40, ignore_eos=True),
    ]
    plain = LLM(target, **options)
    spec = {"model": str(tiny_checkpoint(draft)), "num_speculative_tokens": 3}
    llm = LLM(target, **options, speculative_config=spec)
    assert llm.engine.draft is not None
    stats = llm.engine.scheduler.speculation
    for p in params:
        expected = [r.outputs[0].token_ids for r in plain.generate(prompts, p, use_tqdm=False)]
        outputs = [r.outputs[0].token_ids for r in llm.generate(prompts, p, use_tqdm=False)]
        assert outputs == expected
        if draft == "llama" and p.greedy:  # the target itself agrees with its greedy choices
            assert stats.acceptance_rate > 0.95
    assert stats.num_draft_tokens > 0  # (random weights: another family's draft never agrees)
    _assert_no_leaks(llm)
    assert llm.engine.draft.rank.pool.used_blocks() == 0
