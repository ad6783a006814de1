"""The CUDA graph buckets, and the padded step a graph captures, driven eagerly on the CPU:
a step padded to its bucket (rows without tokens, tokens in no row, bound lengths) gives the
real rows the same hidden states and logits as the step run as it is, for all three families
(Gemma's windowed layers included). The GPU tests replay the captured graphs themselves."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tests.conftest import FAMILIES

from infer import LLM
from infer.attention import ScheduledSequence, build_metadata
from infer.engine.core.cuda_graphs import (
    LONG_DECODE_CONTEXT,
    Bucket,
    CUDAGraphRunner,
    decode_sizes,
    mixed_sizes,
    smallest_fitting,
)
from infer.engine.speculative.token_history import TokenHistory
from infer.engine.speculative.verify_step import (
    VerifyPlan,
    empty_inputs,
    load_rows,
    new_rows,
    verify_metadata,
)
from infer.kernels.verify_inputs import ProposalMode, VerifyShape, verify_inputs


def test_decode_sizes_are_small_powers_then_multiples_of_16() -> None:
    assert decode_sizes(256)[:6] == [1, 2, 4, 8, 16, 32]
    assert decode_sizes(256)[-2:] == [240, 256]
    assert decode_sizes(40) == [1, 2, 4, 8, 16, 32, 40]
    assert decode_sizes(1) == [1]


def test_mixed_sizes_are_small_powers_then_multiples_of_128() -> None:
    assert mixed_sizes(2048)[:6] == [16, 32, 64, 128, 256, 384]
    assert mixed_sizes(2048)[-1] == 2048 and len(mixed_sizes(2048)) == 19
    assert mixed_sizes(100) == [16, 32, 64, 100]
    assert smallest_fitting(mixed_sizes(2048), 513) == 640
    assert smallest_fitting(mixed_sizes(2048), 2049) is None


def _seq(first_block: int, computed: int, new: int, block_size: int = 16) -> ScheduledSequence:
    count = -(-(computed + new) // block_size)
    return ScheduledSequence(list(range(first_block, first_block + count)), computed, [5] * new)


def _runner(
    model: torch.nn.Module, max_batch_size: int = 8, max_tokens: int = 64
) -> CUDAGraphRunner:
    return CUDAGraphRunner(model, 16, max_batch_size, 128, max_tokens, torch.device("cpu"))  # type: ignore[arg-type]


def test_a_decode_step_with_a_long_context_takes_the_bucket_that_splits_keys_more(
    smollm2_llm: LLM,
) -> None:
    graphs = CUDAGraphRunner(
        smollm2_llm.engine.model,
        16,
        32,
        8192,
        64,
        torch.device("cpu"),  # type: ignore[arg-type]
    )
    short = [_seq(i, 300, 1) for i in range(10)]
    assert graphs.bucket_for(short) == Bucket(16, 16, True)
    long = [*short, _seq(99, LONG_DECODE_CONTEXT - 1, 1)]
    assert graphs.bucket_for(long) == Bucket(16, 16, True, long=True)
    assert graphs.bucket_for(long[-3:]) == Bucket(4, 4, True, long=True)
    assert graphs.bucket_for(long[-2:]) == Bucket(2, 2, True)  # 2 rows split as much already
    long_buckets = [b.tokens for b in graphs.buckets if b.long]
    assert long_buckets == [4, 8, 16, 32] and Bucket(16, 16, True, long=True) in graphs.buckets
    # a runner whose context is too short for them captures none
    assert not any(b.long for b in _runner(smollm2_llm.engine.model).buckets)


def test_verify_buckets_sit_beside_the_long_context_decode_buckets(smollm2_llm: LLM) -> None:
    cpu = torch.device("cpu")
    history = TokenHistory(64, 16, cpu)
    model = smollm2_llm.engine.model
    graphs = CUDAGraphRunner(model, 16, 32, 8192, 64, cpu, VerifyShape(5, 1, 2), history)  # type: ignore[arg-type]
    buckets = graphs.buckets
    assert len(set(buckets)) == len(buckets)
    assert [b.tokens for b in buckets if b.long] == [4, 8, 16, 32]
    verify = [b for b in buckets if b.queries]
    assert [b.rows for b in verify] == [1, 2, 4, 8, 16, 32] and not any(b.long for b in verify)
    assert graphs.verify_bucket(9) == Bucket(80, 16, False, queries=5)
    long = [_seq(i, 300, 1) for i in range(9)] + [_seq(99, LONG_DECODE_CONTEXT, 1)]
    assert graphs.bucket_for(long) == Bucket(16, 16, True, long=True)


def test_a_step_finds_the_smallest_bucket_that_holds_it(smollm2_llm: LLM) -> None:
    graphs = _runner(smollm2_llm.engine.model)
    decode = [_seq(i, 20, 1) for i in range(5)]
    assert graphs.bucket_for(decode) == Bucket(8, 8, True)
    assert graphs.bucket_for([_seq(0, 0, 30), *decode]) == Bucket(64, 8, False)
    assert graphs.bucket_for([_seq(0, 0, 60), _seq(9, 0, 10)]) is None  # 70 tokens
    assert graphs.bucket_for([_seq(i, 0, 2) for i in range(9)]) is None  # 9 rows
    assert graphs.bucket_for([_seq(i, 20, 1) for i in range(9)]) is None


@pytest.mark.parametrize("family", FAMILIES)
def test_a_padded_step_gives_the_real_rows_what_the_step_gives_alone(
    family: str, tiny_checkpoint: Callable[[str], Path]
) -> None:
    llm = LLM(str(tiny_checkpoint(family)), num_gpu_blocks=64, max_seq_len=128, max_batch_size=8)
    model = llm.engine.model
    graphs = _runner(model)
    generator = torch.Generator().manual_seed(3)
    mixed = [_seq(0, 0, 21), _seq(2, 40, 1), _seq(6, 16, 12), _seq(10, 3, 1), _seq(12, 30, 9)]
    mixed.append(_seq(15, 50, 1))  # three decode rows: the decode bucket of 4 pads one
    short = [_seq(20, 3, 1), _seq(21, 9, 1), _seq(22, 0, 1)]  # one block each: the wider
    # tables loaded before stay in the buffer's further columns, and nothing reads them
    for seqs in (mixed, [s for s in mixed if len(s.token_ids) == 1], short):
        for s in seqs:
            s.token_ids = torch.randint(3, 300, (len(s.token_ids),), generator=generator).tolist()
        with torch.inference_mode():
            input_ids, meta = build_metadata(seqs, 16, torch.device("cpu"))
            alone = model(input_ids, meta)
            bucket = graphs.bucket_for(seqs)
            assert bucket is not None and bucket.tokens > input_ids.shape[0]
            graphs.load(bucket, seqs)
            padded = graphs.forward(bucket)
            expected = model.compute_logits(alone) if bucket.decode else alone
        real = len(seqs) if bucket.decode else input_ids.shape[0]
        torch.testing.assert_close(padded[:real], expected, atol=1e-5, rtol=1e-5)


def test_a_verify_bucket_gives_the_real_rows_what_an_eager_verify_step_gives(
    tiny_checkpoint: Callable[[str], Path],
) -> None:
    """Three verify rows in the bucket of four: the inputs the graph makes on the device
    (n-gram proposals from the token history) and the logits of every real token."""
    llm = LLM(str(tiny_checkpoint("llama")), num_gpu_blocks=64, max_seq_len=128, max_batch_size=8)
    model, cpu = llm.engine.model, torch.device("cpu")
    history = TokenHistory(64, 16, cpu)
    pattern = [7, 8, 9, 10, 11] * 8
    for table, length in (([0, 1], 20), ([2, 3], 17), ([4], 9)):
        slots = [table[p // 16] * 16 + p % 16 for p in range(length)]
        history.ids[slots] = torch.tensor(pattern[:length], dtype=torch.int32)
    plan = VerifyPlan(
        [[0, 1], [2, 3], [4]], [10, 7, 3], [20, 17, 9], [3, 2, 3], None, ProposalMode.NGRAM
    )
    graphs = CUDAGraphRunner(model, 16, 8, 128, 64, cpu, VerifyShape(4, 1, 2), history)  # type: ignore[arg-type]
    bucket = graphs.verify_bucket(3)
    assert bucket == Bucket(16, 4, False, queries=4)
    with torch.inference_mode():
        graphs.load_verify(plan, None)
        padded = graphs.forward(bucket)[:12]
        made = graphs.verify_outputs(3)
        rows, extra = new_rows(3, cpu)
        tables = torch.empty(3, 2, dtype=torch.int32)
        load_rows(plan, None, rows, extra, tables)
        inputs = empty_inputs(3, 4, cpu)
        verify_inputs(inputs, rows, tables, history.ids, VerifyShape(4, 1, 2), 16)
        meta = verify_metadata(inputs, rows, tables, 4, 128)
        expected = model.compute_logits(model(inputs.input_ids, meta))
    assert made.input_ids.tolist() == inputs.input_ids.tolist()
    assert made.input_ids[:8].tolist() == [10, 11, 7, 8, 7, 8, 7, 7]  # row 1: two proposals
    assert made.num_proposals.tolist() == [3, 2, 0]
    torch.testing.assert_close(padded, expected, atol=1e-5, rtol=1e-5)
