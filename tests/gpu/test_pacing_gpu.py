"""On a GPU, with llama-3.2-3b's shapes (decode steps of ~3.5 ms): paced launches let a request
that arrives while a step runs join the next step, a step sooner, and cost decode steps
nothing."""

from __future__ import annotations

import random
import statistics
import time

import pytest
import torch

from infer import LLM, SamplingParams
from infer.engine.core.engine import Engine
from infer.engine.core.pacing import LaunchPacer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
RUNNING = 6
ROUNDS = 12


def _prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(1000, 20000) for _ in range(length)]


def _round(engine: Engine, rng: random.Random) -> tuple[float, float]:
    """Decode a few steps beside ``RUNNING`` requests, then one request arrives as the
    serving loop takes requests in: (median step interval, its time to first token)."""
    intervals = []
    last = time.perf_counter()
    for _ in range(8):
        engine.wait_to_schedule()
        engine.step()
        now = time.perf_counter()
        intervals.append(now - last)
        last = now
    engine.wait_to_schedule()
    arrival = engine.add_request(
        _prompt(rng, 64), SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    )
    while True:
        for out in engine.step():
            if out.request_id == arrival:
                return statistics.median(intervals[1:]), out.token_times_s[0]
        engine.wait_to_schedule()


def decoding_engine(rng: random.Random) -> Engine:
    """An engine of llama-3.2-3b's shapes with ``RUNNING`` requests decoding."""
    llm = LLM(
        "llama-3.2-3b",
        load_format="dummy",
        max_batch_size=16,
        max_seq_len=2048,
        num_gpu_blocks=1024,
    )
    long = SamplingParams(temperature=0, max_tokens=1500, ignore_eos=True)
    for _ in range(RUNNING):
        llm.engine.add_request(_prompt(rng, 128), long)
    for _ in range(20):
        llm.engine.step()
    return llm.engine


def test_an_arrival_joins_the_next_step_and_decode_steps_lose_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = random.Random(0)
    engine = decoding_engine(rng)
    ahead = engine.ahead
    assert ahead is not None and ahead.pacer is not None  # on by default
    paced: list[tuple[float, float]] = []
    unpaced: list[tuple[float, float]] = []
    leads: list[float] = []
    # One unmeasured round each way first: on a fresh machine the suite failed this test once
    # and passed it three times after, so first-use costs stay out of the comparison.
    for pacer in (LaunchPacer(), None):
        monkeypatch.setattr(ahead, "pacer", pacer)
        _round(engine, rng)
    for i in range(ROUNDS):  # alternating, so both see the same lengths
        pacer = LaunchPacer() if i % 2 == 0 else None
        monkeypatch.setattr(ahead, "pacer", pacer)
        for _ in range(12):  # the pacer learns the step's duration and its own lead
            engine.wait_to_schedule()
            engine.step()
        (paced if pacer is not None else unpaced).append(_round(engine, rng))
        if pacer is not None:
            leads.append(pacer.lead_s)
    step_paced = statistics.median(s for s, _ in paced)
    step_unpaced = statistics.median(s for s, _ in unpaced)
    ttft_paced = statistics.median(t for _, t in paced)
    ttft_unpaced = statistics.median(t for _, t in unpaced)
    lead = statistics.median(leads)
    assert step_paced <= step_unpaced * 1.03, (step_paced, step_unpaced)
    # Unpaced, the arrival waits for the step queued ahead of it (about a decode step); paced,
    # for the host's lead: the next step is queued that long before the one in flight ends.
    assert lead < step_unpaced, (lead, step_unpaced)
    gain = ttft_unpaced - ttft_paced
    assert gain > 0.5 * (step_unpaced - lead), (ttft_paced, ttft_unpaced, step_unpaced, lead)
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.error is None
    assert engine.pool.used_blocks() == 0
