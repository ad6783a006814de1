"""Scheduler: admission budgets, retire→free→admit, chunked prefill, preemption, static mode."""

from __future__ import annotations

import pytest

from infer.cache import PagedKVCachePool, SlottedKVCache, paged
from infer.config import EngineConfig
from infer.contract.errors import QueueFullError
from infer.contract.sampling_params import SamplingParams, StructuredOutputsParams
from infer.engine.core.request import Request, RequestState
from infer.engine.core.scheduler import Scheduler
from infer.engine.core.step import Step
from infer.engine.speculative.speculation import NgramProposer, VerifyCosts


def _pool(blocks: int, block_size: int = 1, prefix: bool = False) -> PagedKVCachePool:
    return PagedKVCachePool(blocks, block_size, prefix)


def _scheduler(pool: PagedKVCachePool, **options: object) -> Scheduler:
    options = {"device": "cpu", "use_prefix_caching": False, **options}
    return Scheduler(EngineConfig(**options), pool, max_seq_len=4096)  # type: ignore[arg-type]


def _request(name: str, prompt_len: int) -> Request:
    return Request(name, list(range(prompt_len)), prompt_len, SamplingParams(), seed=0)


def _collected(
    step: Step,
    tokens: list[int],
    accepted: list[int] | None = None,
    proposed: list[int] | None = None,
) -> Step:
    """Pretend the step ran and its samples (``tokens``) were collected."""
    step.token_ids, step.logprobs = tokens, [None] * len(tokens)
    step.accepted, step.num_proposals = accepted, proposed
    return step


def _run(scheduler: Scheduler, out: Step) -> None:
    """Pretend the step ran: every chunk that samples samples token 0."""
    scheduler.update(_collected(out, [0] * sum(c.samples for c in out.chunks)))


def _names(out: Step) -> list[tuple[str, int]]:
    return [(c.request.request_id, c.num_tokens) for c in out.chunks]


def test_admits_in_arrival_order_up_to_max_batch_size() -> None:
    scheduler = _scheduler(_pool(1000), max_batch_size=2)
    for name in "ABC":
        scheduler.add_request(_request(name, 10))
    assert _names(scheduler.schedule()) == [("A", 10), ("B", 10)]
    assert [r.request_id for r in scheduler.waiting] == ["C"]


def test_token_budget_keeps_a_twenty_percent_generation_reserve() -> None:
    pool = _pool(725)
    pool.allocate_sequence(475)  # another tenant: 250 tokens are free
    scheduler = _scheduler(pool, use_chunked_prefill=False)  # prompts whole, side by side
    for name, length in (("A", 100), ("B", 200), ("C", 299)):
        scheduler.add_request(_request(name, length))
    # usable = int(250 * 0.8) = 200: A fits, then B (200 > 100 left) waits.
    first = scheduler.schedule()
    assert _names(first) == [("A", 100)]
    _run(scheduler, first)
    pool.free_sequence(0)  # the tenant leaves: A decodes into a 101st block, 624 stay free,
    out = scheduler.schedule()  # usable int(624 * 0.8) = 499 = B + C
    assert [n for n, _ in _names(out)] == ["A", "B", "C"]


def test_no_admission_when_no_budget_is_left() -> None:
    pool = _pool(100)
    scheduler = _scheduler(pool)
    scheduler.add_request(_request("A", 100))
    _run(scheduler, scheduler.schedule())
    scheduler.add_request(_request("B", 5))
    out = scheduler.schedule()  # A needs a block for its token; none are free
    assert "B" not in [n for n, _ in _names(out)]


def test_contiguous_backend_admits_by_free_slots_only() -> None:
    pool = SlottedKVCache.for_slots(2, max_seq_len=64, block_size=16)
    scheduler = Scheduler(
        EngineConfig(device="cpu", kv_cache_backend="contiguous", use_prefix_caching=False),
        pool,
        max_seq_len=64,
    )
    for name in "ABC":
        scheduler.add_request(_request(name, 30))
    assert [n for n, _ in _names(scheduler.schedule())] == ["A", "B"]


def test_retired_blocks_are_available_to_admission_in_the_same_step() -> None:
    pool = _pool(20)
    scheduler = _scheduler(pool, admission_reserve=0.0)
    scheduler.add_request(_request("A", 16))
    _run(scheduler, scheduler.schedule())
    scheduler.add_request(_request("B", 16))
    assert _names(scheduler.schedule()) == [("A", 1)]  # B does not fit beside A
    scheduler.running[0].finish("stop")
    scheduler.retire()
    assert _names(scheduler.schedule()) == [("B", 16)]


def test_a_request_that_ends_in_update_frees_its_cache_before_the_outputs_go_out() -> None:
    pool = _pool(20)
    scheduler = _scheduler(pool)
    scheduler.add_request(
        Request("A", [1, 2, 3], 3, SamplingParams(max_tokens=1, ignore_eos=True), seed=0)
    )
    _run(scheduler, scheduler.schedule())
    assert scheduler.running == [] and not scheduler.has_work()
    assert pool.used_blocks() == 0 and pool.stats().active_sequences == 0


def test_chunked_prefill_runs_chunks_beside_decodes_and_samples_only_at_the_end() -> None:
    scheduler = _scheduler(_pool(1000), prefill_chunk_size=16)
    scheduler.add_request(_request("short", 3))
    _run(scheduler, scheduler.schedule())
    scheduler.add_request(_request("long", 40))
    seen = []
    for _ in range(3):
        out = scheduler.schedule()
        seen.append([(c.request.request_id, c.num_tokens, c.samples) for c in out.chunks])
        _run(scheduler, out)
    assert seen == [  # the decode row and the chunk share the chunk size
        [("short", 1, True), ("long", 15, False)],
        [("short", 1, True), ("long", 15, False)],
        [("short", 1, True), ("long", 10, True)],
    ]
    assert scheduler.num_computed(scheduler.running[1]) == 40


def test_a_chunked_prompts_first_chunk_shares_the_chunk_size_with_decode_rows() -> None:
    scheduler = _scheduler(_pool(1000), prefill_chunk_size=16)
    for name in "abcdefghij":
        scheduler.add_request(_request(name, 3))
    _run(scheduler, scheduler.schedule())
    scheduler.add_request(_request("long", 40))
    scheduler.add_request(_request("other", 40))
    scheduler.add_request(_request("fits", 12))
    chunks = [(n, c) for n, c in _names(scheduler.schedule()) if c > 1]
    # 16 - 10 decode rows < 8; the next chunk is whole, and so is a prompt that fits one
    assert chunks == [("long", 8), ("other", 16), ("fits", 12)]


def test_beside_decode_rows_two_prompts_take_turns() -> None:
    """A second chunk in a step would make it a second slow gap for every decoding row: the
    second prompt waits for the first one's chunks (it joins once the first is done)."""
    scheduler = _scheduler(_pool(1000), prefill_chunk_size=16)
    scheduler.add_request(_request("decoding", 3))
    _run(scheduler, scheduler.schedule())
    scheduler.add_request(_request("first", 30))
    scheduler.add_request(_request("second", 30))
    seen = []
    for _ in range(3):
        out = scheduler.schedule()
        seen.append(_names(out))
        _run(scheduler, out)
    assert seen == [
        [("decoding", 1), ("first", 15)],
        [("decoding", 1), ("first", 15)],
        [("decoding", 1), ("first", 1), ("second", 14)],  # 16 less two decode rows
    ]


def test_beside_decode_rows_three_prompts_each_take_a_chunk() -> None:
    """A longer queue shares the step, so that prefill keeps up with arrivals."""
    scheduler = _scheduler(_pool(1000), prefill_chunk_size=16)
    scheduler.add_request(_request("decoding", 3))
    _run(scheduler, scheduler.schedule())
    for name in ("a", "b", "c"):
        scheduler.add_request(_request(name, 30))
    assert _names(scheduler.schedule()) == [("decoding", 1), ("a", 15), ("b", 16), ("c", 16)]


def test_prefill_chunk_cap_per_step() -> None:
    scheduler = _scheduler(
        _pool(1000), prefill_chunk_size=4, max_prefill_chunks_per_step=2, long_prefill_threshold=0
    )
    for name in "ABC":
        scheduler.add_request(_request(name, 10))
    assert _names(scheduler.schedule()) == [("A", 4), ("B", 4)]


def test_with_nothing_decoding_prompts_take_chunks_as_large_as_the_budget() -> None:
    scheduler = _scheduler(_pool(1000), prefill_chunk_size=16, max_num_batched_tokens=300)
    for name, length in (("A", 200), ("B", 150)):
        scheduler.add_request(_request(name, length))
    assert _names(scheduler.schedule()) == [("A", 200), ("B", 100)]  # the budget, not 16


def test_a_long_prompt_takes_the_budget_beside_decodes_a_short_one_the_chunk_size() -> None:
    scheduler = _scheduler(
        _pool(2000), prefill_chunk_size=16, max_num_batched_tokens=300, long_prefill_threshold=100
    )
    scheduler.add_request(_request("decoding", 3))
    _run(scheduler, scheduler.schedule())
    scheduler.add_request(_request("long", 1000))
    scheduler.add_request(_request("short", 100))
    first = scheduler.schedule()
    # 299 for the long prompt (one token is the decode row's), none left for the short one
    assert _names(first) == [("decoding", 1), ("long", 299)]
    _run(scheduler, first)
    _run(scheduler, scheduler.schedule())
    _run(scheduler, scheduler.schedule())
    # its last 103 tokens in one piece (below the threshold, but the prompt is long); the
    # short prompt waits for it (two prompts beside a decode row take turns)
    last = scheduler.schedule()
    assert _names(last) == [("decoding", 1), ("long", 103)]
    _run(scheduler, last)
    assert _names(scheduler.schedule()) == [("decoding", 1), ("long", 1), ("short", 14)]


def test_a_long_prompt_ahead_of_decode_rows_leaves_them_their_tokens() -> None:
    scheduler = _scheduler(_pool(2000), max_num_batched_tokens=300, long_prefill_threshold=100)
    for name, length in (("a", 3), ("b", 3), ("long", 1000)):
        scheduler.add_request(_request(name, length))
    _run(scheduler, scheduler.schedule())  # a, b whole; long's first 294 tokens
    scheduler.running.reverse()  # long first, as the oldest would be
    assert _names(scheduler.schedule()) == [("long", 298), ("b", 1), ("a", 1)]


def test_a_long_prompt_may_take_a_step_of_the_long_prefill_budget() -> None:
    """At the default budget (8,192 tokens a step), a long prompt's chunk may take 16,384
    tokens, the step's decode rows beside it, in whole thousands (1,024) short of its end;
    nothing else joins such a step."""
    config = EngineConfig(device="cpu", use_prefix_caching=False, long_prefill_threshold=9000)
    scheduler = Scheduler(config, _pool(50_000), max_seq_len=40_000)
    scheduler.add_request(_request("decoding", 3))
    _run(scheduler, scheduler.schedule())
    for name, length in (("long", 20_000), ("short", 8_000)):
        scheduler.add_request(_request(name, length))
    first = scheduler.schedule()
    assert _names(first) == [("decoding", 1), ("long", 16 * 1024)]
    _run(scheduler, first)
    # the rest of the long prompt (a long sequence still); the short one waits its turn
    second = scheduler.schedule()
    assert _names(second) == [("decoding", 1), ("long", 3_616)]
    _run(scheduler, second)
    assert _names(scheduler.schedule())[-1] == ("short", 254)  # 256 less two decode rows


def test_a_16k_prompt_beside_many_decode_rows_takes_one_step() -> None:
    """``long_mix``'s shape: a prompt of exactly the long step's 16,384 tokens arrives while
    32 rows decode; it runs whole in one step with all 32 beside it (taking the decode rows
    out of its chunk left its last 1,024 tokens a second slow step for every row)."""
    config = EngineConfig(device="cpu", use_prefix_caching=False)
    scheduler = Scheduler(config, _pool(50_000), max_seq_len=40_000)
    for i in range(32):
        scheduler.add_request(_request(f"decoding{i}", 3))
    _run(scheduler, scheduler.schedule())
    scheduler.add_request(_request("long", 16_384))
    step = scheduler.schedule()
    assert ("long", 16_384) in _names(step)
    assert sum(1 for name, n in _names(step) if name.startswith("decoding") and n == 1) == 32


def test_a_zero_long_prefill_threshold_keeps_every_chunk_small() -> None:
    scheduler = _scheduler(_pool(2000), prefill_chunk_size=16, long_prefill_threshold=0)
    scheduler.add_request(_request("alone", 1000))
    assert _names(scheduler.schedule()) == [("alone", 16)]
    scheduler.add_request(_request("decoding", 3))
    _run(scheduler, scheduler.schedule())  # alone's second chunk; decoding's prompt
    assert _names(scheduler.schedule()) == [("alone", 15), ("decoding", 1)]


def test_without_chunking_a_prompt_runs_whole() -> None:
    scheduler = _scheduler(
        _pool(5000), use_chunked_prefill=False, prefill_chunk_size=16, max_num_batched_tokens=64
    )
    scheduler.add_request(_request("A", 1000))
    assert _names(scheduler.schedule()) == [("A", 1000)]  # the budget grows to max_seq_len


def test_the_newest_request_is_preempted_when_blocks_run_out() -> None:
    pool = _pool(4, block_size=2)
    scheduler = _scheduler(pool, admission_reserve=0.0)
    scheduler.add_request(_request("old", 4))
    scheduler.add_request(_request("new", 3))
    _run(scheduler, scheduler.schedule())  # old: 2 blocks, new: 2 blocks; pool full
    out = scheduler.schedule()  # old needs a third block for position 4
    assert [r.request_id for r in out.preempted] == ["new"]
    assert _names(out) == [("old", 1)]
    new = scheduler.waiting[0]
    assert (
        new.state is RequestState.WAITING
        and scheduler.num_computed(new) == 0
        and new.seq_id is None
    )
    assert new.num_preemptions == 1 and scheduler.preemptions == 1
    assert pool.audit_blocks() == []


def test_preempted_request_resumes_with_its_generated_tokens() -> None:
    pool = _pool(6, block_size=2)
    scheduler = _scheduler(pool, admission_reserve=0.0)
    scheduler.add_request(_request("old", 4))
    scheduler.add_request(_request("new", 3))
    for _ in range(6):
        _run(scheduler, scheduler.schedule())
    scheduler.running[0].finish("stop")
    scheduler.retire()
    out = scheduler.schedule()
    resumed = [c for c in out.chunks if c.request.request_id == "new"]
    assert resumed and resumed[0].num_tokens == resumed[0].request.num_tokens  # recomputed


def test_static_batching_admits_only_when_the_batch_is_done() -> None:
    pool = SlottedKVCache.for_slots(4, max_seq_len=64, block_size=16)
    config = EngineConfig(
        device="cpu",
        batching_mode="static",
        kv_cache_backend="contiguous",
        use_chunked_prefill=False,
        use_prefix_caching=False,
        max_batch_size=2,
    )
    scheduler = Scheduler(config, pool, max_seq_len=64)
    for name in "ABC":
        scheduler.add_request(_request(name, 5))
    _run(scheduler, scheduler.schedule())
    scheduler.running[0].finish("stop")
    scheduler.retire()
    assert _names(scheduler.schedule()) == [("B", 1)]  # C waits for B
    scheduler.running[0].finish("stop")
    scheduler.retire()
    assert _names(scheduler.schedule()) == [("C", 5)]


def test_full_queue_is_rejected() -> None:
    scheduler = _scheduler(_pool(10), max_waiting_requests=2)
    scheduler.add_request(_request("A", 1))
    scheduler.add_request(_request("B", 1))
    with pytest.raises(QueueFullError, match="max_waiting_requests"):
        scheduler.add_request(_request("C", 1))


def test_abort_of_waiting_and_running_requests() -> None:
    pool = _pool(100)
    scheduler = _scheduler(pool, max_batch_size=1)
    scheduler.add_request(_request("run", 5))
    scheduler.add_request(_request("wait", 5))
    _run(scheduler, scheduler.schedule())
    assert scheduler.abort("wait") is not None and not scheduler.waiting
    assert scheduler.abort("run") is not None
    assert scheduler.abort("unknown") is None
    scheduler.retire()
    assert not scheduler.has_work() and pool.allocator.num_free() == 100


def test_a_request_larger_than_the_whole_pool_fails_alone() -> None:
    scheduler = _scheduler(_pool(8))
    scheduler.add_request(_request("huge", 20))
    out = scheduler.schedule()
    assert out.chunks == []
    (failed,) = out.failed
    assert failed.finish_reason == "error" and "too small" in (failed.error or "")


def test_prefix_hits_skip_computed_tokens() -> None:
    pool = _pool(100, block_size=4, prefix=True)
    scheduler = _scheduler(pool, use_prefix_caching=True)
    scheduler.add_request(_request("first", 10))
    _run(scheduler, scheduler.schedule())
    scheduler.add_request(_request("second", 10))
    out = scheduler.schedule()
    assert ("second", 2) in _names(out)  # 8 tokens came from the cache
    assert [r.num_cached_tokens for r in scheduler.running] == [0, 8]


def test_prefix_hits_need_the_same_cache_salt() -> None:
    pool = _pool(100, block_size=4, prefix=True)
    scheduler = _scheduler(pool, use_prefix_caching=True)
    for name, salt in (("a", "tenant-a"), ("b", "tenant-b"), ("a-again", "tenant-a")):
        params = SamplingParams(cache_salt=salt)
        scheduler.add_request(Request(name, list(range(10)), 10, params, seed=0))
        _run(scheduler, scheduler.schedule())
    assert [r.num_cached_tokens for r in scheduler.running] == [0, 0, 8]


def test_a_preempted_request_keeps_its_block_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = _pool(6, block_size=2, prefix=True)
    scheduler = _scheduler(pool, admission_reserve=0.0, use_prefix_caching=True)
    scheduler.add_request(_request("old", 4))
    scheduler.add_request(_request("new", 5))
    _run(scheduler, scheduler.schedule())
    new = scheduler.running[1]
    keys = list(new.block_keys)
    assert len(keys) == 2  # its two full prompt blocks
    starts: list[int] = []  # the first block hashed, per call on new's tokens
    original = paged.block_keys

    def counting(token_ids, block_size, start=0, parent=b""):  # type: ignore[no-untyped-def]
        if list(token_ids[:5]) == new.prompt_token_ids:
            starts.append(start)
        return original(token_ids, block_size, start, parent)

    monkeypatch.setattr(paged, "block_keys", counting)
    while new.num_preemptions == 0:
        _run(scheduler, scheduler.schedule())
    scheduler.running[0].finish("stop")  # old leaves: room for new to start again
    out = scheduler.schedule()
    assert new in scheduler.running and out.chunks and new.block_keys[:2] == keys
    assert starts and min(starts) >= 2  # its prompt blocks were never hashed again


def _fed(out: Step) -> list[tuple[str, int]]:
    """The rows fed from the step in flight: (request, its row among that step's samples)."""
    return [(out.chunks[row].request.request_id, sample) for row, sample in out.fed_rows]


def test_the_step_ahead_continues_decodes_and_chunks_and_admits_newcomers() -> None:
    scheduler = _scheduler(_pool(1000), prefill_chunk_size=16)
    scheduler.add_request(_request("short", 3))
    scheduler.add_request(_request("other", 2))
    _run(scheduler, scheduler.schedule())
    scheduler.add_request(_request("long", 40))
    in_flight = scheduler.schedule()  # two decode rows and long's first chunk
    scheduler.add_request(_request("new", 5))
    scheduler.add_request(_request("newer", 6))
    ahead = scheduler.schedule_ahead(in_flight)
    assert ahead is not None
    assert _names(ahead) == [("short", 1), ("other", 1), ("long", 14), ("new", 5), ("newer", 6)]
    assert _fed(ahead) == [("short", 0), ("other", 1)]  # the placeholders of the step in flight
    _run(scheduler, in_flight)
    _run(scheduler, ahead)
    assert [scheduler.num_computed(r) for r in scheduler.running] == [5, 4, 28, 5, 6]


def test_a_placeholder_that_ends_its_request_is_not_continued_ahead() -> None:
    scheduler = _scheduler(_pool(1000))
    request = Request("r", [1, 2, 3], 3, SamplingParams(max_tokens=2), seed=0)
    scheduler.add_request(request)
    _run(scheduler, scheduler.schedule())  # the first output token
    in_flight = scheduler.schedule()  # the second, its last
    assert scheduler.schedule_ahead(in_flight) is None


def test_short_of_blocks_the_step_ahead_stops_and_the_next_one_is_synchronous() -> None:
    scheduler = _scheduler(_pool(21), admission_reserve=0.0)
    scheduler.add_request(_request("A", 10))
    scheduler.add_request(_request("B", 10))
    in_flight = scheduler.schedule()  # 20 of the 21 blocks
    ahead = scheduler.schedule_ahead(in_flight)  # one block left: A's next token only
    assert ahead is not None and _names(ahead) == [("A", 1)] and ahead.needs_host
    assert scheduler.schedule_ahead(ahead) is None  # a preemption needs the host
    _run(scheduler, in_flight)
    _run(scheduler, ahead)
    out = scheduler.schedule()
    assert _names(out) == [("A", 1)] and [r.request_id for r in out.preempted] == ["B"]


# --- speculative decoding -------------------------------------------------------------------
NGRAM = {"num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
REPEATING = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5]  # ends in 5: 6, 7, 8 followed it last time


def _speculating(pool: PagedKVCachePool) -> Scheduler:
    config = EngineConfig(device="cpu", use_prefix_caching=False, speculative_config=NGRAM)  # type: ignore[arg-type]
    assert config.speculative_config is not None
    return Scheduler(config, pool, 4096, NgramProposer(config.speculative_config))


def _decoding(scheduler: Scheduler, prompt: list[int], **params: object) -> Request:
    """A request admitted and prefilled, whose first sample was ``prompt[-1]``'s successor
    in the pattern: it has one known token to decode."""
    request = Request("A", list(prompt[:-1]), len(prompt) - 1, SamplingParams(**params), seed=0)  # type: ignore[arg-type]
    scheduler.add_request(request)
    prefill = scheduler.schedule()
    scheduler.update(_collected(prefill, [prompt[-1]]))
    return request


def test_a_decoding_row_runs_its_token_and_the_ngram_proposal_after_it() -> None:
    scheduler = _speculating(_pool(100, block_size=4))
    request = _decoding(scheduler, REPEATING)
    out = scheduler.schedule()
    (chunk,) = out.chunks
    assert (chunk.start, chunk.num_tokens, chunk.proposals) == (10, 4, [6, 7, 8])
    assert chunk.num_samples == 4 and chunk.output_index == 1 and out.speculative
    assert scheduler.schedule_ahead(out) is None  # the next input is known on the host only
    assert request.num_tokens == 11


def test_update_keeps_the_agreeing_samples_and_rewinds_the_cache_over_the_rest() -> None:
    pool = _pool(100, block_size=4)
    scheduler = _speculating(pool)
    request = _decoding(scheduler, REPEATING)
    out = scheduler.schedule()
    # Samples after 5, 6, 7, 8: 6 agrees with the first proposal, 1 not with the second.
    (new,) = scheduler.update(_collected(out, [6, 1, 2, 3]))
    assert new.token_ids == [6, 1] and request.output_token_ids == [5, 6, 1]
    assert pool.get_seq_len(request.seq_id) == 12  # type: ignore[arg-type]
    assert len(pool.block_table(request.seq_id)) == 3  # type: ignore[arg-type]
    assert pool.audit_blocks() == [] and request.num_placeholders == 0
    assert (scheduler.speculation.num_draft_tokens, scheduler.speculation.num_accepted_tokens) == (
        3,
        1,
    )
    (next_chunk,) = scheduler.schedule().chunks
    assert next_chunk.start == 12 and next_chunk.proposals == []  # ...5, 6, 1: no match


def test_every_proposal_accepted_yields_one_token_more_than_proposed() -> None:
    scheduler = _speculating(_pool(100, block_size=4))
    request = _decoding(scheduler, REPEATING)
    out = scheduler.schedule()
    (new,) = scheduler.update(_collected(out, [6, 7, 8, 9]))
    assert new.token_ids == [6, 7, 8, 9]
    assert scheduler.pool.get_seq_len(request.seq_id) == 14  # type: ignore[arg-type]


def test_a_stop_token_among_the_accepted_samples_ends_the_request_there() -> None:
    scheduler = _speculating(_pool(100, block_size=4))
    request = _decoding(scheduler, REPEATING, stop_token_ids=[7])
    out = scheduler.schedule()
    (new,) = scheduler.update(_collected(out, [6, 7, 8, 9]))
    assert new.token_ids == [6, 7] and request.finish_reason == "stop"
    scheduler.schedule()  # retires it
    assert scheduler.pool.used_blocks() == 0


def test_proposals_stay_within_max_tokens() -> None:
    scheduler = _speculating(_pool(100, block_size=4))
    _decoding(scheduler, REPEATING, max_tokens=3)  # one output so far: two more allowed
    (chunk,) = scheduler.schedule().chunks
    assert chunk.proposals == [6]


def test_rows_under_a_grammar_or_penalties_speculate_too() -> None:
    grammar = {"structured_outputs": StructuredOutputsParams(regex="[0-9]+")}
    for params in (grammar, {"repetition_penalty": 1.2}):
        scheduler = _speculating(_pool(100, block_size=4))
        _decoding(scheduler, REPEATING, **params)
        (chunk,) = scheduler.schedule().chunks
        assert chunk.proposals == [6, 7, 8]


def test_proposals_never_preempt() -> None:
    pool = _pool(3, block_size=4)  # 11 tokens hold all three blocks: no room for more
    scheduler = _speculating(pool)
    _decoding(scheduler, REPEATING)
    out = scheduler.schedule()
    assert [(c.num_tokens, c.proposals) for c in out.chunks] == [(1, [])]
    assert out.preempted == []


def test_without_speculation_steps_are_scheduled_ahead() -> None:
    scheduler = _scheduler(_pool(100, block_size=4))
    _decoding(scheduler, REPEATING)
    out = scheduler.schedule()
    assert not out.speculative and out.chunks[0].proposals == []
    assert scheduler.schedule_ahead(out) is not None


# --- verify steps (proposals made on the device) --------------------------------------------
Q = 4  # NGRAM's three proposals and the row's own token


def _verifying(pool: PagedKVCachePool, max_seq_len: int = 4096) -> Scheduler:
    scheduler = _speculating(pool)
    scheduler.max_seq_len = max_seq_len
    scheduler.use_device_proposals(Q, VerifyCosts({1: 1.02, 2: 1.05, 4: 1.1}))
    return scheduler


def _verified(
    out: Step, samples: list[list[int]], accepted: list[int], proposed: list[int]
) -> Step:
    """A verify step collected: ``Q`` samples a row, its accepted and proposed counts."""
    return _collected(out, [t for row in samples for t in row], accepted, proposed)


def test_a_decoding_batch_verifies_device_proposals_in_rows_of_q_tokens() -> None:
    pool = _pool(100, block_size=4)
    scheduler = _verifying(pool)
    request = _decoding(scheduler, REPEATING)
    out = scheduler.schedule()
    (chunk,) = out.chunks
    assert out.verify_queries == Q and not out.speculative and out.fed_rows == []
    assert (chunk.start, chunk.num_tokens, chunk.proposals, chunk.verify) == (10, Q, [], True)
    assert chunk.proposal_limit == 3 and chunk.num_samples == Q
    assert pool.get_seq_len(request.seq_id) == 10 + Q  # type: ignore[arg-type]


def test_update_keeps_the_accepted_samples_and_rewinds_the_rest() -> None:
    pool = _pool(100, block_size=4)
    scheduler = _verifying(pool)
    request = _decoding(scheduler, REPEATING)
    out = scheduler.schedule()
    (new,) = scheduler.update(_verified(out, [[6, 7, 1, 2]], [2], [3]))
    assert new.token_ids == [6, 7, 1] and request.output_token_ids == [5, 6, 7, 1]
    assert pool.get_seq_len(request.seq_id) == 13  # type: ignore[arg-type]
    assert request.num_placeholders == 0 and pool.audit_blocks() == []
    stats = scheduler.speculation
    assert (stats.num_verify_steps, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, 3, 2)


def test_verify_steps_are_scheduled_ahead_and_learn_where_they_start_from_the_one_before() -> None:
    pool = _pool(100, block_size=4)
    scheduler = _verifying(pool)
    request = _decoding(scheduler, REPEATING)
    first = scheduler.schedule()
    second = scheduler.schedule_ahead(first)
    assert second is not None and second.verify_queries == Q and second.fed_rows == [(0, 0)]
    (chunk,) = second.chunks
    assert chunk.start == 11  # as if the first kept one token: the device adds the rest
    assert pool.get_seq_len(request.seq_id) == 10 + 2 * Q  # type: ignore[arg-type]
    scheduler.update(_verified(first, [[6, 7, 8, 3]], [2], [3]))
    assert chunk.start == 13 and request.num_tokens == 14
    assert pool.get_seq_len(request.seq_id) == 13 + Q  # type: ignore[arg-type]
    third = scheduler.schedule_ahead(second)
    assert third is not None and third.chunks[0].start == 14
    scheduler.update(_verified(second, [[9, 4, 4, 4]], [0], [2]))
    assert third.chunks[0].start == 14 and request.output_token_ids == [5, 6, 7, 8, 9]
    assert pool.get_seq_len(request.seq_id) == 14 + Q  # type: ignore[arg-type]


def test_a_verify_step_follows_a_plain_step_in_flight_fed_from_its_sample() -> None:
    pool = _pool(100, block_size=4)
    scheduler = _verifying(pool)
    scheduler.gate.limits = lambda requests, cost: [0] * len(requests)  # type: ignore[union-attr,method-assign]
    request = _decoding(scheduler, REPEATING)
    plain = scheduler.schedule()
    assert plain.verify_queries == 0 and _names(plain) == [("A", 1)]
    del scheduler.gate.limits  # type: ignore[union-attr]
    ahead = scheduler.schedule_ahead(plain)
    assert ahead is not None and ahead.verify_queries == Q and ahead.fed_rows == [(0, 0)]
    assert ahead.chunks[0].start == 11
    assert pool.get_seq_len(request.seq_id) == 11 + Q  # type: ignore[arg-type]


def test_after_a_verify_step_a_plain_one_waits_for_the_host() -> None:
    """When the gate closes, the step after a verify step is not scheduled ahead (only the
    device knows where its rows go on); the synchronous one after it is plain."""
    pool = _pool(100, block_size=4)
    scheduler = _verifying(pool)
    request = _decoding(scheduler, REPEATING)
    out = scheduler.schedule()
    scheduler.gate.limits = lambda requests, cost: [0] * len(requests)  # type: ignore[union-attr,method-assign]
    assert scheduler.schedule_ahead(out) is None
    scheduler.update(_verified(out, [[6, 1, 2, 3]], [1], [3]))
    plain = scheduler.schedule()
    assert _names(plain) == [("A", 1)] and plain.chunks[0].start == request.num_tokens - 1


def test_a_request_to_admit_makes_the_next_step_plain() -> None:
    scheduler = _verifying(_pool(100, block_size=4))
    _decoding(scheduler, REPEATING)
    scheduler.add_request(_request("B", 5))
    out = scheduler.schedule()
    assert out.verify_queries == 0 and [n for n, _ in _names(out)] == ["A", "B"]


def test_a_request_the_pool_cannot_hold_yet_does_not_stop_the_verify_steps() -> None:
    scheduler = _verifying(_pool(6, block_size=4))  # 24 tokens: A holds 11 and grows
    _decoding(scheduler, REPEATING)
    scheduler.add_request(_request("B", 12))
    out = scheduler.schedule()
    assert out.verify_queries == Q and _names(out) == [("A", Q)]


def test_rows_whose_sampling_reads_their_outputs_propose_on_the_host() -> None:
    scheduler = _verifying(_pool(100, block_size=4))
    _decoding(scheduler, REPEATING, repetition_penalty=1.2)
    out = scheduler.schedule()
    assert out.verify_queries == 0 and out.speculative and out.chunks[0].proposals == [6, 7, 8]


def test_no_verify_step_runs_past_the_context_or_without_blocks() -> None:
    scheduler = _verifying(_pool(100, block_size=4), max_seq_len=13)  # 10 + 4 > 13
    _decoding(scheduler, REPEATING)
    assert scheduler.schedule().verify_queries == 0
    scheduler = _verifying(_pool(3, block_size=4))  # 11 tokens fill the three blocks
    _decoding(scheduler, REPEATING)
    assert scheduler.schedule().verify_queries == 0


def test_batches_no_verify_graph_holds_do_not_verify() -> None:
    scheduler = _verifying(_pool(200, block_size=4))
    scheduler.costs = VerifyCosts({1: 1.02})
    for name in "AB":
        scheduler.add_request(Request(name, REPEATING[:-1], 10, SamplingParams(), seed=0))
    _run(scheduler, scheduler.schedule())
    out = scheduler.schedule()
    assert out.verify_queries == 0 and not out.speculative


def test_a_batch_too_wide_to_pay_costs_the_host_no_shadow_lookups() -> None:
    scheduler = _verifying(_pool(200, block_size=4))
    scheduler.costs = VerifyCosts({1: 1.02}, max_rows=1)
    lookups: list[int] = []
    scheduler.gate.shadow = lambda tokens, k: lookups.append(1) or []  # type: ignore[union-attr]
    for name in "AB":
        scheduler.add_request(Request(name, REPEATING[:-1], 10, SamplingParams(), seed=0))
    for _ in range(20):
        _run(scheduler, scheduler.schedule())
    assert lookups == []
