"""Triton kernels of ``verify_inputs`` and ``accept_proposals``, one program per row. The
n-gram lookup steps through the row's earlier positions ``BLOCK`` at a time, gathering token
ids through its block table, so it costs what the row's length asks and reads its length on
the device."""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from infer.kernels.verify_inputs import ProposalMode, RowStarts, VerifyInputs, VerifyShape

_BLOCK = 256  # candidate positions a lookup step compares
_NO_MATCH = tl.constexpr(1 << 62)


# fmt: off
@triton.jit
def _token_at(History, table, position, base, first, block_size, mask):
    """The token id at ``position`` of the row (``first`` at ``base``: not in history yet)."""
    block = tl.load(table + position // block_size, mask=mask, other=0).to(tl.int64)
    known = tl.load(History + block * block_size + position % block_size, mask=mask, other=-1)
    return tl.where(position == base, first, known.to(tl.int64))


@triton.jit
def _match_end(History, table, base, first, length, limit, block_size,
               N: tl.constexpr, BLOCK: tl.constexpr):
    """The end of the occurrence of the last ``N`` tokens that ``ngram_lookup`` takes:
    the latest with ``limit`` tokens after it, else the earliest; -1 if none."""
    latest_whole = tl.full([], -1, tl.int64)
    earliest = tl.full([], _NO_MATCH, tl.int64)
    offs = tl.arange(0, BLOCK).to(tl.int64)
    for start in range(N - 1, length - 1, BLOCK):
        ends = start + offs
        valid = ends <= length - 2  # windows end before the last token
        match = valid
        for i in tl.static_range(N):
            want = _token_at(History, table, length - N + i, base, first, block_size, base >= 0)
            got = _token_at(History, table, ends - (N - 1) + i, base, first, block_size, valid)
            match = match & (got == want)
        whole = match & (ends + 1 + limit <= length)
        latest_whole = tl.maximum(latest_whole, tl.max(tl.where(whole, ends, -1), 0))
        earliest = tl.minimum(earliest, tl.min(tl.where(match, ends, _NO_MATCH), 0))
    return tl.where(latest_whole >= 0, latest_whole,
                    tl.where(earliest < _NO_MATCH, earliest, -1))


@triton.jit
def _verify_inputs_kernel(
    InputIds, Positions, Slots, SeqLens, NumProposals,
    First, Base, Limit, Mode, Given, Tables, History, NumRows,
    stride_given, stride_table, block_size,
    Q: tl.constexpr, Q_POW2: tl.constexpr, MIN_N: tl.constexpr, MAX_N: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.arange(0, Q_POW2)
    in_row = offs < Q
    tokens = row * Q + offs
    if row >= tl.load(NumRows):  # a padding row: no tokens
        tl.store(InputIds + tokens, tl.zeros([Q_POW2], tl.int64), mask=in_row)
        tl.store(Positions + tokens, tl.zeros([Q_POW2], tl.int64), mask=in_row)
        tl.store(Slots + tokens, tl.full([Q_POW2], -1, tl.int64), mask=in_row)
        tl.store(SeqLens + row, 0)
        tl.store(NumProposals + row, 0)
        return
    first = tl.load(First + row).to(tl.int64)
    base = tl.load(Base + row).to(tl.int64)
    limit = tl.minimum(tl.load(Limit + row).to(tl.int64), Q - 1)
    mode = tl.load(Mode)
    table = Tables + row * stride_table
    length = base + 1

    # Proposals: ``count`` tokens from position ``source`` of the row (n-gram), or given.
    source = tl.full([], 0, tl.int64)
    count = tl.full([], 0, tl.int64)
    if mode == 0:  # ProposalMode.NGRAM
        for n in tl.static_range(MAX_N, MIN_N - 1, -1):  # the longest n-gram first
            if (count == 0) & (length > n) & (limit > 0):
                end = _match_end(History, table, base, first, length, limit, block_size, n, BLOCK)
                if end >= 0:
                    source = end + 1
                    count = tl.minimum(limit, length - source)
    else:
        count = limit
    index = (offs - 1).to(tl.int64)
    proposed = (offs >= 1) & (index < count)
    modes = offs * 0 + mode  # (a scalar condition broadcast first: masks must be blocks)
    from_history = _token_at(History, table, source + index, base, first, block_size,
                             proposed & (modes == 0))
    given = tl.load(Given + row * stride_given + index, mask=proposed & (modes == 1), other=0)
    proposal = tl.where(mode == 0, from_history, tl.where(mode == 1, given.to(tl.int64), first))
    ids = tl.where(proposed, proposal, first)
    positions = base + offs
    block = tl.load(table + positions // block_size, mask=in_row, other=0).to(tl.int64)
    tl.store(InputIds + tokens, ids, mask=in_row)
    tl.store(Positions + tokens, positions, mask=in_row)
    tl.store(Slots + tokens, block * block_size + positions % block_size, mask=in_row)
    tl.store(SeqLens + row, (base + Q).to(tl.int32))
    tl.store(NumProposals + row, count.to(tl.int32))


@triton.jit
def _accept_kernel(Samples, Inputs, NumProposals, Packed, Continues, rows,
                   Q: tl.constexpr, Q_POW2: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, Q_POW2)
    in_row = offs < Q
    samples = tl.load(Samples + row * Q + offs, mask=in_row, other=0)
    # The proposal after sample j is input j + 1: it stands while all before it did.
    after = tl.load(Inputs + row * Q + offs + 1, mask=offs < Q - 1, other=-1)
    count = tl.load(NumProposals + row)
    missed = (samples != after) | (offs >= count)
    accepted = tl.min(tl.where(missed, offs, Q), 0)  # the first proposal that does not stand
    tl.store(Packed + row * Q + offs, samples, mask=in_row)
    tl.store(Packed + rows * Q + row, accepted.to(tl.int64))
    tl.store(Packed + rows * (Q + 1) + row, count.to(tl.int64))
    tl.store(Continues + row, tl.sum(tl.where(offs == accepted, samples, 0), 0))
# fmt: on


def accept_proposals_triton(
    samples: Tensor,
    input_ids: Tensor,
    num_proposals: Tensor,
    queries: int,
    packed: Tensor,
    continues: Tensor,
) -> None:
    rows = num_proposals.shape[0]
    _accept_kernel[(rows,)](
        samples, input_ids, num_proposals, packed, continues, rows,
        Q=queries, Q_POW2=triton.next_power_of_2(queries), num_warps=1,
    )  # fmt: skip


def verify_inputs_triton(
    out: VerifyInputs,
    rows: RowStarts,
    block_tables: Tensor,
    history: Tensor,
    shape: VerifyShape,
    block_size: int,
) -> None:
    assert int(ProposalMode.NGRAM) == 0 and int(ProposalMode.GIVEN) == 1
    _verify_inputs_kernel[(block_tables.shape[0],)](
        out.input_ids, out.positions, out.slot_mapping, out.seq_lens, out.num_proposals,
        rows.first, rows.base, rows.limit, rows.mode, rows.given, block_tables, history,
        rows.num_rows, rows.given.stride(0), block_tables.stride(0), block_size,
        Q=shape.queries, Q_POW2=triton.next_power_of_2(shape.queries), MIN_N=shape.min_n,
        MAX_N=shape.max_n, BLOCK=_BLOCK, num_warps=4,
    )  # fmt: skip
