"""Engine behaviour step by step: streaming, chunk silence, failures, aborts, capacity."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from infer import LLM, SamplingParams
from infer.config import EngineConfig
from infer.contract.outputs import RequestOutput
from infer.contract.sampling_params import StructuredOutputsParams
from infer.engine.core.engine import Engine
from infer.engine.structured.grammar_cache import CompiledGrammar, StructuredOutputs

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def llama(tiny_checkpoint: Callable[[str], Path]) -> str:
    return str(tiny_checkpoint("llama"))


def _engine(model: str, **options: object) -> Engine:
    settings = {"model": model, "num_gpu_blocks": 64, "max_seq_len": 256, **options}
    return Engine(EngineConfig(**settings))  # type: ignore[arg-type]


def _drain(engine: Engine) -> dict[str, list]:  # type: ignore[type-arg]
    outputs: dict[str, list] = {}  # type: ignore[type-arg]
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    return outputs


def test_intermediate_prefill_chunks_emit_nothing(llama: str) -> None:
    engine = _engine(
        llama, prefill_chunk_size=8, long_prefill_threshold=0, use_async_scheduling=False
    )
    engine.add_request(list(range(3, 30)), GREEDY, request_id="long")  # 4 chunks
    emitted = [len(engine.step()) for _ in range(4)]
    assert emitted == [0, 0, 0, 1]
    assert engine.scheduler.num_computed(engine.scheduler.running[0]) == 27


def test_with_async_scheduling_the_next_chunk_is_in_flight_when_a_step_returns(
    llama: str,
) -> None:
    engine = _engine(llama, prefill_chunk_size=8, long_prefill_threshold=0)
    engine.add_request(list(range(3, 30)), GREEDY, request_id="long")  # 4 chunks
    computed = []
    for _ in range(4):
        engine.step()
        computed.append(engine.scheduler.num_computed(engine.scheduler.running[0]))
    # Each call collects one step and leaves the next queued: chunks, then the first decode.
    assert computed == [16, 24, 27, 28]


def test_a_failed_step_fails_its_requests_frees_their_blocks_and_keeps_serving(
    llama: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _engine(llama, prefill_chunk_size=8, long_prefill_threshold=0)
    engine.add_request(list(range(3, 30)), GREEDY, request_id="victim")
    engine.step()  # first chunk runs fine
    original = engine.runner.launch

    def broken(chunks, input_ids=None):  # type: ignore[no-untyped-def]
        raise RuntimeError("device fell over")

    monkeypatch.setattr(engine.runner, "launch", broken)
    (failed,) = engine.step()  # mid-prefill failure
    assert failed.finished and failed.finish_reason == "error"
    assert "device fell over" in (failed.error or "")
    monkeypatch.setattr(engine.runner, "launch", original)
    engine.add_request([5, 6, 7], GREEDY, request_id="next")
    outputs = _drain(engine)
    assert outputs["next"][-1].finish_reason == "length"
    assert engine.pool.audit_blocks() == [] and engine.pool.used_blocks() == 0


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_a_step_that_fails_for_one_request_fails_only_that_request(
    llama: str, monkeypatch: pytest.MonkeyPatch, async_scheduling: bool
) -> None:
    prompts = {f"good{i}": list(range(3 + i, 20 + 2 * i)) for i in range(4)}
    alone = _engine(llama, use_async_scheduling=async_scheduling)
    for name, prompt in prompts.items():
        alone.add_request(prompt, GREEDY, request_id=name)
    expected = {name: outs[-1].token_ids for name, outs in _drain(alone).items()}

    engine = _engine(llama, use_async_scheduling=async_scheduling)
    original = engine.runner.launch

    def fails_with_bad(scheduled, previous=None):  # type: ignore[no-untyped-def]
        if any(c.request.request_id == "bad" for c in scheduled.chunks):
            raise RuntimeError("device-side assert")
        return original(scheduled, previous)

    monkeypatch.setattr(engine.runner, "launch", fails_with_bad)
    for name, prompt in prompts.items():
        engine.add_request(prompt, GREEDY, request_id=name)
    for _ in range(3):
        engine.step()  # the good requests are decoding when the bad one joins
    engine.add_request([7, 8, 9], GREEDY, request_id="bad")
    outputs = _drain(engine)
    assert outputs["bad"][-1].finish_reason == "error"
    assert "device-side assert" in (outputs["bad"][-1].error or "")
    for name in prompts:
        assert outputs[name][-1].finish_reason == "length"
        assert outputs[name][-1].token_ids == expected[name]
    assert engine.pool.audit_blocks() == [] and engine.pool.used_blocks() == 0


def test_abort_frees_blocks_within_one_step(llama: str) -> None:
    engine = _engine(llama)
    engine.add_request([4, 5, 6], SamplingParams(max_tokens=100, ignore_eos=True), request_id="a")
    engine.step()
    engine.step()
    assert engine.pool.used_blocks() > 0
    assert engine.abort("a")
    engine.step()
    assert engine.pool.used_blocks() == 0 and not engine.has_unfinished_requests()
    assert not engine.abort("a")


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "prompt: must not be empty"),
        ([1] * 256, "prompt: 256 tokens"),
        ([1, 99999], r"prompt: token ids must be in \[0, 320\)"),
        ("text", "prompt: this model has no tokenizer"),
    ],
)
def test_bad_prompts_are_rejected_before_reaching_the_scheduler(
    llama: str, prompt: object, message: str
) -> None:
    engine = _engine(llama)
    with pytest.raises(ValueError, match=message):
        engine.add_request(prompt, GREEDY)  # type: ignore[arg-type]
    assert not engine.has_unfinished_requests()


def test_unknown_llm_option_is_named(llama: str) -> None:
    with pytest.raises(ValueError, match=r"^blok_size: not an EngineConfig option"):
        LLM(llama, blok_size=16)


def test_timings_are_reported_per_token(llama: str) -> None:
    llm = LLM(llama, num_gpu_blocks=64, max_seq_len=256)
    (result,) = llm.generate([[3, 4, 5]], GREEDY, use_tqdm=False)
    completion = result.outputs[0]
    assert completion.ttft_s is not None and completion.ttft_s > 0
    assert len(completion.token_times_s) == 8
    assert completion.token_times_s == sorted(completion.token_times_s)
    assert completion.token_times_s[0] == pytest.approx(completion.ttft_s)


@pytest.mark.usefixtures("unfrozen_heap")
def test_generate_steps_with_the_heap_frozen_and_hands_it_back(llama: str) -> None:
    """No full collection scans the model's heap between steps (a pause of ~250 ms was
    measured in a 256-request burst); after the call everything is collectable again."""
    llm = LLM(llama, num_gpu_blocks=64, max_seq_len=256)
    frozen_during_steps = []
    step = llm.engine.step

    def recording_step() -> list:  # type: ignore[type-arg]
        frozen_during_steps.append(gc.get_freeze_count() > 0)
        return step()

    llm.engine.step = recording_step  # type: ignore[method-assign]
    llm.generate([[3, 4, 5]], GREEDY, use_tqdm=False)
    assert frozen_during_steps and all(frozen_during_steps)
    assert gc.get_freeze_count() == 0


def test_n_samples_with_a_seed_are_distinct_and_reproducible(llama: str) -> None:
    llm = LLM(llama, num_gpu_blocks=64, max_seq_len=256)
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=12, ignore_eos=True)
    first = llm.generate([[3, 4, 5]], params, use_tqdm=False)[0]
    again = llm.generate([[3, 4, 5]], params, use_tqdm=False)[0]
    samples = [c.token_ids for c in first.outputs]
    assert [c.index for c in first.outputs] == [0, 1, 2]
    assert len({tuple(s) for s in samples}) == 3
    assert samples == [c.token_ids for c in again.outputs]


def test_prefix_cache_hits_give_the_same_output(llama: str) -> None:
    llm = LLM(llama, num_gpu_blocks=64, max_seq_len=256, block_size=4)
    prompt = list(range(3, 40))
    first = llm.generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    second = llm.generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    assert first == second
    assert llm.cache_stats()["prefix_hits"] >= 9  # 36 of the 37 prompt tokens were cached


def test_cache_stats_report_the_seed_004_metrics(llama: str) -> None:
    llm = LLM(llama, num_gpu_blocks=64, max_seq_len=256)
    llm.generate([[3, 4, 5]], GREEDY, use_tqdm=False)
    stats = llm.cache_stats()
    for key in (
        "num_blocks",
        "used_blocks",
        "utilization",
        "internal_fragmentation",
        "allocs_per_s",
        "frees_per_s",
        "preemptions",
        "evictions",
        "leaked_blocks",
    ):
        assert key in stats
    assert stats["num_blocks"] == 64 and stats["total_allocations"] > 0


def test_paged_admits_four_times_the_sequences_of_contiguous_at_the_same_budget(llama: str) -> None:
    """Seed 000 exit 2: same KV memory, average length a quarter of max_seq_len."""
    max_seq_len, slots, block = 256, 4, 16
    budget_blocks = slots * max_seq_len // block  # what the contiguous cache reserves
    prompts = [[3 + i % 50] * 32 for i in range(32)]  # 32 prompt + 32 output = 64 tokens
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)

    def peak_concurrency(**options: object) -> int:
        engine = _engine(llama, max_seq_len=max_seq_len, block_size=block, **options)
        for prompt in prompts:
            engine.add_request(prompt, params)
        peak = 0
        while engine.has_unfinished_requests():
            engine.step()
            peak = max(peak, engine.num_running)
        return peak

    contiguous = peak_concurrency(
        kv_cache_backend="contiguous", max_batch_size=slots, use_prefix_caching=False
    )
    paged = peak_concurrency(
        num_gpu_blocks=budget_blocks,
        max_batch_size=64,
        use_prefix_caching=False,
        admission_reserve=0.0,
    )
    assert contiguous == slots
    assert paged >= 4 * contiguous


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_a_stop_token_ends_the_output_exactly_there(llama: str, async_scheduling: bool) -> None:
    """With async scheduling the step after a stop is already queued; its token is dropped."""
    llm = LLM(llama, num_gpu_blocks=64, max_seq_len=256, use_async_scheduling=async_scheduling)
    free_run = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    reference = llm.generate([[3, 4, 5]], free_run, use_tqdm=False)[0].outputs[0].token_ids
    stop = reference[6]
    cut = reference.index(stop) + 1
    params = SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[stop], ignore_eos=True)
    completion = llm.generate([[3, 4, 5]], params, use_tqdm=False)[0].outputs[0]
    assert completion.token_ids == reference[:cut] and completion.finish_reason == "stop"
    assert llm.engine.pool.used_blocks() == 0 and llm.engine.pool.audit_blocks() == []


def test_chunk_boundaries_give_the_same_tokens_as_whole_prefills(llama: str) -> None:
    """Seed 001 exits 9-11: a 1-token prompt, a prompt of exactly one chunk, one token
    more, two chunks, a chunk larger than the prompt, and a prompt of many chunks."""
    many = [3 + (i * 37) % 300 for i in range(400)]
    prompts = [[7], list(range(3, 19)), list(range(3, 20)), list(range(3, 35)), many]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)

    def greedy(**options: object) -> list[list[int]]:
        llm = LLM(llama, num_gpu_blocks=64, max_seq_len=512, **options)
        return [r.outputs[0].token_ids for r in llm.generate(prompts, params, use_tqdm=False)]

    whole = greedy(use_chunked_prefill=False)
    assert greedy(prefill_chunk_size=16, long_prefill_threshold=0) == whole
    assert greedy(prefill_chunk_size=64, long_prefill_threshold=0) == whole


def test_chunked_and_whole_prefill_give_the_same_first_token_logprobs(llama: str) -> None:
    """Seed 001 exit 4, adapted: the last prompt position's log-probabilities agree (to
    float32 rounding: different batch shapes may reorder sums, so not bit for bit)."""
    prompt = list(range(3, 45))
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=5)

    def first_logprobs(**options: object) -> dict[int, float]:
        llm = LLM(llama, num_gpu_blocks=64, max_seq_len=256, **options)
        return llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].logprobs[0].top

    whole = first_logprobs(use_chunked_prefill=False)
    chunked = first_logprobs(prefill_chunk_size=8, long_prefill_threshold=0)
    assert list(chunked) == list(whole)
    assert list(chunked.values()) == pytest.approx(list(whole.values()), abs=1e-5)


def test_the_cache_holds_exactly_the_prefilled_tokens_after_every_chunk(llama: str) -> None:
    """Seed 001 exit 12: the pool's length equals the request's prefill progress (with
    nothing in flight: async scheduling counts the queued chunk too)."""
    engine = _engine(
        llama, prefill_chunk_size=8, long_prefill_threshold=0, use_async_scheduling=False
    )
    engine.add_request(list(range(3, 30)), GREEDY, request_id="r")
    for expected in (8, 16, 24, 27):
        engine.step()
        (request,) = engine.scheduler.running
        assert engine.scheduler.num_computed(request) == expected


def test_a_seeded_request_samples_the_same_tokens_with_and_without_async_scheduling(
    llama: str,
) -> None:
    params = SamplingParams(temperature=0.9, seed=5, max_tokens=12, ignore_eos=True)
    runs = []
    for async_scheduling in (True, False):
        engine = _engine(llama, use_async_scheduling=async_scheduling)
        engine.add_request([3, 4, 5, 6], params, request_id="r")
        runs.append(_drain(engine)["r"][-1].token_ids)
    assert runs[0] == runs[1]


def test_launch_pacing_needs_async_scheduling_and_never_sleeps_on_the_cpu(llama: str) -> None:
    assert _engine(llama, use_async_scheduling=False).ahead is None
    ahead = _engine(llama, use_launch_pacing=False).ahead
    assert ahead is not None and ahead.pacer is None
    engine = _engine(llama)
    assert engine.ahead is not None and engine.ahead.pacer is not None
    engine.add_request(list(range(3, 20)), GREEDY, request_id="a")
    slept = []
    while engine.has_unfinished_requests():
        if engine.ahead.in_flight is not None:
            slept.append(engine.ahead.pacer.wait((1, 1)))
        engine.step()
    # The CPU's steps are done when they are queued: the host never waits, so none is timed.
    assert slept and set(slept) == {0.0}
    assert engine.ahead.pacer.expected_s((1, 1)) is None


def test_a_loop_waiting_for_a_grammar_sleeps_instead_of_spinning(
    smollm2_llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the only request's grammar compiles (held 2 s here), the generating loop
    blocks on the engine's wake-up: a few steps find nothing to run (one, plus one per
    second of its safety check), not one per turn of a busy loop."""
    build = StructuredOutputs._build

    def slow_build(self: StructuredOutputs, grammar: str) -> CompiledGrammar:
        time.sleep(2.0)
        return build(self, grammar)

    engine = smollm2_llm.engine
    step = engine.step
    stalled_steps = 0

    def counted_step() -> list[RequestOutput]:
        nonlocal stalled_steps
        outputs = step()
        stalled_steps += engine.stalled
        return outputs

    monkeypatch.setattr(StructuredOutputs, "_build", slow_build)
    monkeypatch.setattr(engine, "step", counted_step)
    choices = ["yes", "no", f"never {time.time_ns()}"]  # a grammar no test has cached
    params = SamplingParams(
        temperature=0.0, max_tokens=3, structured_outputs=StructuredOutputsParams(choice=choices)
    )
    result = smollm2_llm.generate(["Pick one:"], params, use_tqdm=False)[0]
    assert result.outputs[0].finish_reason in ("stop", "length")
    assert 1 <= stalled_steps <= 4
