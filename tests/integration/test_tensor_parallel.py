"""Tensor parallelism on the CPU (gloo): greedy tokens of TP=2 equal TP=1's, for tiny random
checkpoints of all three families (Gemma's sliding windows; its single KV head replicated on
both ranks); the logprobs agree to float32 rounding (the all-reduce sums in another order);
a worker that dies is an error, not a hang. SmolLM2's real GGUF weights (9 heads: TP=3) are
checked split over three nodes, in test_multinode.py."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.conftest import FAMILIES

from infer import LLM, SamplingParams
from infer.distributed.group import WorkerDiedError
from infer.engine.llm import Completion

OPTIONS = {"device": "cpu", "dtype": "float32", "num_gpu_blocks": 64, "max_batch_size": 4}
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=0)
# Longer than Gemma's window (8) and than a block (16); a prefix shared by two prompts.
PROMPTS = [[5, 17, 33, 2, 9], list(range(3, 40)), [5, 17, 33, 2, 9, 101, 7]]


def generate(model: str, tp: int, prompts: list[list[int]] | list[str]) -> list[Completion]:
    llm = LLM(model, tensor_parallel_size=tp, max_seq_len=256, **OPTIONS)
    try:
        return [r.outputs[0] for r in llm.generate(prompts, GREEDY, use_tqdm=False)]
    finally:
        llm.engine.close()


def assert_same(single: list[Completion], split: list[Completion]) -> None:
    for one, many in zip(single, split, strict=True):
        assert one.token_ids == many.token_ids
        assert len(one.logprobs) == len(one.token_ids) == 16
        for a, b in zip(one.logprobs, many.logprobs, strict=True):
            assert b.logprob == pytest.approx(a.logprob, abs=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_tp2_equals_tp1_on_tiny_checkpoints(
    family: str, tiny_checkpoint: Callable[[str], Path]
) -> None:
    model = str(tiny_checkpoint(family))
    assert_same(generate(model, 1, PROMPTS), generate(model, 2, PROMPTS))


def test_tp2_with_ngram_speculation_equals_tp1(tiny_checkpoint: Callable[[str], Path]) -> None:
    """Every rank runs the proposals the rank 0 scheduler adds (the same step inputs)."""
    model = str(tiny_checkpoint("llama"))
    ngram = {"num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    llm = LLM(model, tensor_parallel_size=2, max_seq_len=256, speculative_config=ngram, **OPTIONS)
    try:
        split = [r.outputs[0] for r in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
        assert llm.engine.scheduler.speculation.num_accepted_tokens > 0
    finally:
        llm.engine.close()
    assert_same(generate(model, 1, PROMPTS), split)


def test_dead_worker_is_an_error(tiny_checkpoint: Callable[[str], Path]) -> None:
    llm = LLM(str(tiny_checkpoint("llama")), tensor_parallel_size=2, max_seq_len=64, **OPTIONS)
    # Rank 0's share of the pool: all 64 blocks, one of the two KV heads.
    assert llm.engine.runner.storage.k.shape[1:3] == (64, 1)
    workers = llm.engine.workers
    assert workers is not None
    workers.processes[1].kill()
    workers.processes[1].wait()
    with pytest.raises(WorkerDiedError, match="worker rank 1 exited"):
        llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    llm.engine.close()


def test_unsplittable_model_names_the_flag(tiny_checkpoint: Callable[[str], Path]) -> None:
    with pytest.raises(ValueError, match="tensor_parallel_size: 3 ranks cannot split"):
        LLM(str(tiny_checkpoint("llama")), tensor_parallel_size=3, **OPTIONS)


def test_worker_that_cannot_start_is_an_error(
    tiny_checkpoint: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", shutil.which("false"))  # exits with code 1
    with pytest.raises(WorkerDiedError, match="worker rank 1 exited with code 1"):
        LLM(str(tiny_checkpoint("llama")), tensor_parallel_size=2, **OPTIONS)


def test_a_whole_prompt_cache_hit_copies_its_last_block_on_every_rank(
    tiny_checkpoint: Callable[[str], Path],
) -> None:
    """Run again, a prompt of whole blocks hits the prefix cache for all of it: its last
    token is recomputed into a copy of its last block, which each rank makes of its heads."""
    prompt = [list(range(3, 35))]  # two blocks of 16
    llm = LLM(str(tiny_checkpoint("llama")), tensor_parallel_size=2, max_seq_len=256, **OPTIONS)
    try:
        first = llm.generate(prompt, GREEDY, use_tqdm=False)[0].outputs[0]
        again = llm.generate(prompt, GREEDY, use_tqdm=False)[0].outputs[0]
        assert llm.engine.cache_stats()["prefix_hit_rate"] > 0
    finally:
        llm.engine.close()
    assert_same([first], [again])
