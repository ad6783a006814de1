"""A verify step's device-made inputs: the Triton kernel (interpreter on CPU) against the
torch reference, and the reference against the host's n-gram lookup."""

from __future__ import annotations

import random

import pytest
import torch
from tests.unit.kernels.h100_compile import assert_compiles_for_h100

from infer.kernels.verify_inputs import (
    ProposalMode,
    RowStarts,
    VerifyInputs,
    VerifyShape,
    accept_proposals,
    ngram_lookup,
    verify_inputs_torch,
    write_history,
)
from infer.kernels.verify_inputs_triton import accept_proposals_triton, verify_inputs_triton

BLOCK_SIZE = 4
QUERIES = 5


def _rows_with_history(
    sequences: list[list[int]], mode: ProposalMode, limits: list[int], padding: int = 0
) -> tuple[RowStarts, torch.Tensor, torch.Tensor]:
    """Rows whose tokens but the last sit in a shuffled paged history; the last is
    ``first``. Each row owns blocks for its tokens and a verify step after them."""
    rng = random.Random(0)
    widths = [-(-(len(s) + QUERIES) // BLOCK_SIZE) for s in sequences]
    blocks = list(range(1, sum(widths) + 1))
    rng.shuffle(blocks)
    history = torch.full(((sum(widths) + 1) * BLOCK_SIZE + 1,), -7, dtype=torch.int32)
    tables = torch.zeros(len(sequences) + padding, max(widths), dtype=torch.int32)
    used = 0
    for row, (tokens, width) in enumerate(zip(sequences, widths, strict=True)):
        tables[row, :width] = torch.tensor(blocks[used : used + width])
        used += width
        slots = [
            int(tables[row, p // BLOCK_SIZE]) * BLOCK_SIZE + p % BLOCK_SIZE
            for p in range(len(tokens) - 1)
        ]
        history[slots] = torch.tensor(tokens[:-1], dtype=torch.int32)
    count = len(sequences) + padding
    rows = RowStarts(
        first=torch.tensor([s[-1] for s in sequences] + [0] * padding),
        base=torch.tensor([len(s) - 1 for s in sequences] + [0] * padding),
        limit=torch.tensor(limits + [0] * padding, dtype=torch.int32),
        mode=torch.tensor([int(mode)], dtype=torch.int32),
        given=torch.arange(count * (QUERIES - 1)).view(count, QUERIES - 1) + 500,
        num_rows=torch.tensor([len(sequences), 0], dtype=torch.int32),
    )
    return rows, tables, history


def _empty(rows: int) -> VerifyInputs:
    return VerifyInputs(
        input_ids=torch.full((rows * QUERIES,), -3, dtype=torch.int64),
        positions=torch.full((rows * QUERIES,), -3, dtype=torch.int64),
        slot_mapping=torch.full((rows * QUERIES,), -3, dtype=torch.int64),
        seq_lens=torch.full((rows,), -3, dtype=torch.int32),
        num_proposals=torch.full((rows,), -3, dtype=torch.int32),
    )


def _both(rows: RowStarts, tables: torch.Tensor, history: torch.Tensor, min_n: int, max_n: int):
    outputs = []
    for fill in (verify_inputs_torch, verify_inputs_triton):
        out = _empty(tables.shape[0])
        fill(out, rows, tables, history, VerifyShape(QUERIES, min_n, max_n), BLOCK_SIZE)
        outputs.append(out)
    return outputs


def _assert_same(a: VerifyInputs, b: VerifyInputs) -> None:
    for name in ("input_ids", "positions", "slot_mapping", "seq_lens", "num_proposals"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), msg=name)


SEQUENCES = [
    [1, 2, 3, 4, 9, 1, 2, 3, 4, 8, 7, 1, 2, 3, 4],  # matches twice: the latest whole one
    [5, 6, 7, 5, 6],  # the match runs to the end: fewer proposals than asked
    [10, 11, 12, 13, 14, 15],  # no match
    [3, 3, 3, 3, 3, 3, 3, 3, 3],  # overlapping matches
    [20, 21, 22, 23, 20, 21, 22, 23, 24, 25, 20, 21, 22, 23, 26, 20, 21, 22, 23],
    [1, 2, 5, 6, 7, 8, 1, 2, 3, 1, 2],  # the latest match has just enough tokens after it
]


@pytest.mark.parametrize(("min_n", "max_n"), [(1, 3), (2, 2), (3, 5)])
def test_kernel_finds_the_proposals_of_the_reference(min_n: int, max_n: int) -> None:
    rows, tables, history = _rows_with_history(SEQUENCES, ProposalMode.NGRAM, [4, 4, 4, 2, 3, 3], 2)
    reference, kernel = _both(rows, tables, history, min_n, max_n)
    _assert_same(kernel, reference)


def test_reference_proposes_what_the_host_lookup_does() -> None:
    rows, tables, history = _rows_with_history(SEQUENCES, ProposalMode.NGRAM, [4, 4, 4, 2, 3, 3])
    out = _both(rows, tables, history, 1, 3)[0]
    for row, tokens in enumerate(SEQUENCES):
        ids = out.input_ids[row * QUERIES : (row + 1) * QUERIES].tolist()
        expected = ngram_lookup(tokens, int(rows.limit[row]), 1, 3)
        count = int(out.num_proposals[row])
        assert ids[0] == tokens[-1] and ids[1 : 1 + count] == expected
        assert ids[1 + count :] == [tokens[-1]] * (QUERIES - 1 - count)
    assert out.num_proposals.tolist() == [4, 3, 0, 2, 3, 3]
    assert out.input_ids[:QUERIES].tolist() == [4, 8, 7, 1, 2]  # the latest whole match
    assert out.input_ids[5 * QUERIES + 1 : 6 * QUERIES - 1].tolist() == [3, 1, 2]


def test_positions_slots_and_lengths_follow_the_block_table() -> None:
    rows, tables, history = _rows_with_history(SEQUENCES[:2], ProposalMode.REPEAT, [4, 1], 1)
    out = _both(rows, tables, history, 1, 3)[1]
    base = len(SEQUENCES[1]) - 1
    assert out.positions[QUERIES : 2 * QUERIES].tolist() == list(range(base, base + QUERIES))
    slots = [
        int(tables[1, p // BLOCK_SIZE]) * BLOCK_SIZE + p % BLOCK_SIZE
        for p in range(base, base + QUERIES)
    ]
    assert out.slot_mapping[QUERIES : 2 * QUERIES].tolist() == slots
    assert out.seq_lens.tolist() == [len(SEQUENCES[0]) - 1 + QUERIES, base + QUERIES, 0]
    assert out.slot_mapping[2 * QUERIES :].tolist() == [-1] * QUERIES  # the padding row
    assert out.input_ids[QUERIES : 2 * QUERIES].tolist() == [6] * QUERIES
    assert out.num_proposals.tolist() == [4, 1, 0]


@pytest.mark.parametrize("mode", [ProposalMode.GIVEN, ProposalMode.REPEAT])
def test_given_and_repeated_proposals(mode: ProposalMode) -> None:
    rows, tables, history = _rows_with_history(SEQUENCES[:3], mode, [4, 0, 2])
    reference, kernel = _both(rows, tables, history, 1, 3)
    _assert_same(kernel, reference)
    if mode is ProposalMode.GIVEN:
        assert kernel.input_ids[:QUERIES].tolist() == [4, 500, 501, 502, 503]
        assert kernel.input_ids[2 * QUERIES : 3 * QUERIES].tolist() == [15, 508, 509, 15, 15]


def test_a_long_history_is_searched_in_steps() -> None:
    """More earlier positions than a lookup step compares: the match lies in an early step."""
    rng = random.Random(1)
    tokens = [rng.randrange(1000, 2000) for _ in range(700)]
    tokens[40:44] = [1, 2, 3, 4]
    tokens[44:47] = [77, 78, 79]
    tokens += [1, 2, 3, 4]
    rows, tables, history = _rows_with_history([tokens], ProposalMode.NGRAM, [3])
    reference, kernel = _both(rows, tables, history, 2, 4)
    _assert_same(kernel, reference)
    assert kernel.input_ids[1:4].tolist() == [77, 78, 79]


def test_write_history_skips_unwritten_tokens() -> None:
    history = torch.zeros(9, dtype=torch.int32)
    write_history(history, torch.tensor([5, 6, 7]), torch.tensor([2, -1, 7]))
    assert history[:8].tolist() == [0, 0, 5, 0, 0, 0, 0, 7]


def test_accept_kernel_counts_what_the_reference_does() -> None:
    generator = torch.Generator().manual_seed(2)
    rows = 6
    inputs = torch.randint(0, 3, (rows * QUERIES,), generator=generator)
    samples = torch.randint(0, 3, (rows * QUERIES,), generator=generator)
    samples[:4] = inputs[1:5]  # row 0: every proposal stands
    counts = torch.tensor([4, 4, 2, 0, 3, 1], dtype=torch.int32)
    packed = [torch.full((rows * (QUERIES + 2),), -5, dtype=torch.int64) for _ in range(2)]
    reference = accept_proposals(samples, inputs, counts, QUERIES, packed[0])
    kernel = torch.empty(rows, dtype=torch.int64)
    accept_proposals_triton(samples, inputs, counts, QUERIES, packed[1], kernel)
    torch.testing.assert_close(kernel, reference)
    torch.testing.assert_close(packed[1], packed[0])
    assert (
        packed[0][rows * QUERIES] == 4
        and packed[0][rows * (QUERIES + 1) :].tolist() == counts.tolist()
    )


_COMPILE = """
from infer.kernels import verify_inputs_triton as kernels

pointers = {
    "InputIds": "*i64", "Positions": "*i64", "Slots": "*i64", "SeqLens": "*i32",
    "NumProposals": "*i32", "First": "*i64", "Base": "*i64", "Limit": "*i32", "Mode": "*i32",
    "Given": "*i64", "Tables": "*i32", "History": "*i32", "NumRows": "*i32",
    "stride_given": "i64", "stride_table": "i64", "block_size": "i32", "Samples": "*i64",
    "Inputs": "*i64", "Packed": "*i64", "Continues": "*i64", "rows": "i32",
}
cases = [
    (kernels._verify_inputs_kernel, {"Q": 5, "Q_POW2": 8, "MIN_N": 1, "MAX_N": 3, "BLOCK": 256}),
    (kernels._accept_kernel, {"Q": 5, "Q_POW2": 8}),
]
for kernel, constants in cases:
    compile_for_h100(kernel, pointers, constants)
"""


def test_the_kernels_compile_for_a_gpu() -> None:
    """The interpreter runs what Triton's compiler rejects (a size that is not a constexpr):
    compile for an H100, which needs no GPU (in a process of its own: the tests' kernels
    are the interpreter's)."""
    assert_compiles_for_h100(_COMPILE)
