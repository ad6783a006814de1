"""The rehearsed first traffic: every part runs, its requests fit the context and cover
the batch sizes, and nothing of it stays in the engine that then serves."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infer.cache.paged import PagedKVCachePool
from infer.cache.slotted import SlottedKVCache
from infer.config import EngineConfig
from infer.contract.sampling_params import SamplingParams
from infer.engine.core.engine import Engine
from infer.engine.core.runner import ModelRunner
from infer.engine.loop import drain
from infer.engine.setup import rehearsal
from infer.engine.setup.rehearsal import PARTS, WAVE, _waves, emptied

OPTIONS = {"device": "cpu", "max_batch_size": 4, "max_seq_len": 128, "prefill_chunk_size": 16}


@pytest.fixture(scope="module")
def llama(tiny_checkpoint: Callable[[str], Path]) -> str:
    return str(tiny_checkpoint("llama"))


def _engine(model: str, warm_up: bool) -> Engine:
    return Engine(EngineConfig(model=model, use_warm_up=warm_up, **OPTIONS))  # type: ignore[arg-type]


def test_every_part_runs_and_nothing_of_it_stays(llama: str) -> None:
    engine = _engine(llama, warm_up=True)
    # The tiny checkpoint has no tokenizer: no grammars.
    assert [p.label for p in engine.warm_up] == [p.label for p in PARTS if not p.needs_tokenizer]
    assert all(p.log.seconds > 0 for p in engine.warm_up)
    assert engine.num_prompt_tokens == engine.num_generated_tokens == 0
    assert not engine.has_unfinished_requests()
    stats = engine.cache_stats()
    assert stats["total_allocations"] == stats["prefix_queries"] == stats["cached_blocks"] == 0
    assert engine.add_request([5, 6, 7], SamplingParams(max_tokens=1)) == "0"
    # The pacer that timed the rehearsal's steps (on a GPU) paces the first requests.
    assert engine.ahead is not None
    assert engine.pacer is not None and engine.ahead.pacer is engine.pacer


def test_a_warmed_engine_samples_what_a_cold_one_does(
    llama: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rehearsal draws no seed from the engine's generator (these requests take theirs
    from it) and leaves nothing cached."""
    monkeypatch.setattr(rehearsal, "PARTS", PARTS[:1] + PARTS[-3:-1])
    outputs = []
    for warm_up in (True, False):
        engine = _engine(llama, warm_up)
        ids = [engine.add_request([9, 8, 7, 6, 5], SamplingParams(max_tokens=6)) for _ in "ab"]
        finished = {}
        while engine.has_unfinished_requests():
            finished.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
        outputs.append([finished[i] for i in ids])
    assert outputs[0] == outputs[1]


def test_repeating_prompts_get_speculative_proposals(
    llama: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With n-gram speculation on, the rehearsal runs verify steps (their sampling of
    several positions a row) before the first request does."""
    (part,) = [p for p in PARTS if p.repeating]
    monkeypatch.setattr(rehearsal, "PARTS", (part,))
    verified = []

    def drain_and_count(engine: Engine) -> None:
        drain(engine)
        verified.append(engine.scheduler.speculation.num_verify_steps)

    monkeypatch.setattr(rehearsal, "drain", drain_and_count)
    # Through the verify path with proposals made on the device (``verify_step``).
    queries = []
    launch_verify = ModelRunner._launch_verify

    def count_verify_steps(runner: ModelRunner, step: Any, previous: Any) -> Any:
        queries.append(step.verify_queries)
        return launch_verify(runner, step, previous)

    monkeypatch.setattr(ModelRunner, "_launch_verify", count_verify_steps)
    spec = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}
    engine = Engine(
        EngineConfig(model=llama, use_warm_up=True, speculative_config=spec, **OPTIONS)  # type: ignore[arg-type]
    )
    assert verified and verified[-1] > 0
    assert queries and set(queries) == {3}
    assert engine.scheduler.speculation.num_verify_steps == 0  # counted afresh


@pytest.mark.parametrize("max_seq_len", [24, 4096])
def test_requests_fit_the_context_and_cover_each_batch_size(max_seq_len: int) -> None:
    for part in PARTS:
        waves = _waves(part, burst=32, chunk=16, max_seq_len=max_seq_len)
        for wave in waves:
            for request in wave:
                assert request.params.max_tokens is not None
                assert 1 <= request.prompt_len <= max_seq_len - request.params.max_tokens
                assert request.params.ignore_eos
        lengths = {r.params.max_tokens for r in waves[-1]}
        if part.long_prompt:
            assert len(waves) == 1 and len(waves[0]) == 1
        else:  # decode batches shrink through every size (every residue mod 4)
            assert lengths == set(range(1, WAVE + 1))
        if part.burst:
            assert len(waves[0]) == 32
        prompt_lens = {r.prompt_len for w in waves for r in w}
        if max_seq_len > 64 and not part.long_prompt:  # odd and even token counts
            assert len({n % 2 for n in prompt_lens}) == 2


def test_a_shared_prefix_wave_follows_its_first_request() -> None:
    (part,) = [p for p in PARTS if p.shared_prefix]
    first, wave = _waves(part, burst=4, chunk=16, max_seq_len=4096)
    assert len(first) == 1 and all(r.shared for r in first + wave)
    assert all(r.prompt_len > rehearsal.SHARED_PREFIX for r in wave)


def test_emptied_pools_keep_their_shape_and_nothing_else() -> None:
    pool = PagedKVCachePool(8, 4, use_prefix_caching=True)
    seq = pool.allocate_sequence(8, list(range(8)))
    assert seq is not None
    pool.advance(seq, 8)
    pool.index_blocks(seq, list(range(8)))
    pool.free_sequence(seq)
    empty = emptied(pool)
    assert isinstance(empty, PagedKVCachePool) and empty.prefix is not None
    assert (empty.num_blocks, empty.block_size) == (8, 4)
    assert empty.stats().cached_blocks == 0 and pool.stats().cached_blocks == 2
    slots = emptied(SlottedKVCache.for_slots(2, 32, 16))
    assert isinstance(slots, SlottedKVCache) and (slots.num_slots, slots.max_seq_len) == (2, 32)
