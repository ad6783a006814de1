"""The inputs of a step that verifies speculative proposals, made on the device.

Every row of such a step runs ``Q`` tokens (``queries``): the sample it continues from
(``first``, at position ``base``) and up to ``Q - 1`` proposed tokens after it, found where
the row's own tokens are: an n-gram lookup over the token ids the cache's slots hold
(``history``, written by every step beside the K/V, ``write_history``). Nothing here needs
the host to know the row's tokens or even its length, so the step can be queued while the one
before it, which decides both, is still running. A row with fewer proposals fills its other
tokens with ``first`` (computed, never accepted). Padding rows (from ``num_rows`` on) get no
tokens: slot -1, length 0.

``mode`` picks where the proposals come from: ``NGRAM`` the lookup; ``GIVEN`` the host's
(``given``, e.g. a draft model's); ``REPEAT`` ``first`` again (a benchmark's fixed cost).

After sampling, ``accept_proposals`` counts per row how many proposals stand (each while it
equals the sample before it) and picks the sample after them, the next step's first token.

The torch references loop over rows on the host (or use a few tensor ops); the Triton
kernels (``verify_inputs_triton``) run one program per row, the first captured in the
verify step's CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view
from torch import Tensor

from infer.kernels.dispatch import use_triton


@dataclass(frozen=True)
class VerifyShape:
    """Tokens a verify row runs (``queries``: the proposals plus one) and the n-gram sizes
    its lookup tries."""

    queries: int
    min_n: int
    max_n: int


class ProposalMode(IntEnum):
    NGRAM = 0
    GIVEN = 1
    REPEAT = 2


@dataclass
class VerifyInputs:
    """What the op fills: a verify step's flat inputs (``[R * Q]``) and per-row lengths."""

    input_ids: Tensor  # int64
    positions: Tensor  # int64
    slot_mapping: Tensor  # int64, -1 for padding rows
    seq_lens: Tensor  # [R] int32: context after the step (base + Q)
    num_proposals: Tensor  # [R] int32


@dataclass
class RowStarts:
    """Where each row starts: its first token and that token's position, how many proposals
    it may take, where they come from, and the real rows (the rest pad a graph's bucket)."""

    first: Tensor  # [R] int64
    base: Tensor  # [R] int64
    limit: Tensor  # [R] int32
    mode: Tensor  # [1] int32 (``ProposalMode``)
    given: Tensor  # [R, >= 1] int64 (mode ``GIVEN``)
    num_rows: Tensor  # [>= 1] int32: the first entry counts the real rows


def ngram_lookup(token_ids: list[int], max_tokens: int, min_n: int, max_n: int) -> list[int]:
    """The tokens that followed an earlier occurrence of the last ``n`` tokens, for the
    longest ``n`` in [``min_n``, ``max_n``] that has one: from the latest occurrence with
    ``max_tokens`` after it, else the earliest (the longest continuation)."""
    length = len(token_ids)
    if max_tokens <= 0 or length <= min_n:
        return []
    tokens = np.asarray(token_ids, dtype=np.int64)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        # Windows ending before the last token: each has at least one token after it.
        windows = sliding_window_view(tokens[:-1], n)
        hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
        if hits.size:
            whole = hits[hits + n + max_tokens <= length]
            start = int(whole[-1] if whole.size else hits[0]) + n
            return token_ids[start : start + max_tokens]
    return []


def write_history(history: Tensor, input_ids: Tensor, slot_mapping: Tensor) -> None:
    """Record each token's id in its cache slot (slot -1: the sink, ``history``'s last)."""
    sink = history.shape[0] - 1
    slots = torch.where(slot_mapping >= 0, slot_mapping, sink)
    history.index_copy_(0, slots, input_ids.to(history.dtype))


def verify_inputs(
    out: VerifyInputs,
    rows: RowStarts,
    block_tables: Tensor,
    history: Tensor,
    shape: VerifyShape,
    block_size: int,
) -> None:
    """Fill ``out`` for the rows of ``block_tables`` (see the module's docstring)."""
    if use_triton(history):
        from infer.kernels.verify_inputs_triton import verify_inputs_triton

        verify_inputs_triton(out, rows, block_tables, history, shape, block_size)
        return
    verify_inputs_torch(out, rows, block_tables, history, shape, block_size)


def verify_inputs_torch(
    out: VerifyInputs,
    rows: RowStarts,
    block_tables: Tensor,
    history: Tensor,
    shape: VerifyShape,
    block_size: int,
) -> None:
    """Reference: one row at a time on the host (the CPU path and the kernel's tests)."""
    queries, min_n, max_n = shape.queries, shape.min_n, shape.max_n
    num_rows = int(rows.num_rows[0])
    mode = ProposalMode(int(rows.mode[0]))
    tables = block_tables.long().cpu()
    known = history.cpu()
    ids, positions, slots = [], [], []
    seq_lens, counts = [], []
    for row in range(block_tables.shape[0]):
        if row >= num_rows:
            ids += [0] * queries
            positions += [0] * queries
            slots += [-1] * queries
            seq_lens.append(0)
            counts.append(0)
            continue
        first, base = int(rows.first[row]), int(rows.base[row])
        limit = min(int(rows.limit[row]), queries - 1)
        table = tables[row]

        def slot_of(position: int, table: Tensor = table) -> int:
            return int(table[position // block_size]) * block_size + position % block_size

        if mode is ProposalMode.NGRAM:
            tokens = [int(known[slot_of(p)]) for p in range(base)] + [first]
            proposals = ngram_lookup(tokens, limit, min_n, max_n)
        elif mode is ProposalMode.GIVEN:
            proposals = rows.given[row, :limit].tolist()
        else:
            proposals = [first] * limit
        row_positions = list(range(base, base + queries))
        ids += [first, *proposals] + [first] * (queries - 1 - len(proposals))
        positions += row_positions
        slots += [slot_of(p) for p in row_positions]
        seq_lens.append(base + queries)
        counts.append(len(proposals))
    device = out.input_ids.device
    out.input_ids.copy_(torch.tensor(ids, dtype=torch.int64, device=device))
    out.positions.copy_(torch.tensor(positions, dtype=torch.int64, device=device))
    out.slot_mapping.copy_(torch.tensor(slots, dtype=torch.int64, device=device))
    out.seq_lens.copy_(torch.tensor(seq_lens, dtype=out.seq_lens.dtype, device=device))
    out.num_proposals.copy_(torch.tensor(counts, dtype=out.num_proposals.dtype, device=device))


def accept_proposals(
    samples: Tensor, input_ids: Tensor, num_proposals: Tensor, queries: int, packed: Tensor
) -> Tensor:
    """Per row of a verify step's ``samples`` (``[R * Q]``, the tokens it ran ``input_ids``):
    the proposals that stand, written with the samples and the proposal counts into
    ``packed`` (``[R * Q + 2R]`` int64: samples, accepted, proposed: one copy to the host);
    returns the sample each row continues from (``[R]``)."""
    rows = num_proposals.shape[0]
    continues = torch.empty(rows, dtype=torch.int64, device=samples.device)
    if use_triton(samples):
        from infer.kernels.verify_inputs_triton import accept_proposals_triton

        accept_proposals_triton(samples, input_ids, num_proposals, queries, packed, continues)
        return continues
    tokens = samples.view(rows, queries)
    agree = tokens[:, :-1] == input_ids.view(rows, queries)[:, 1:]
    proposed = torch.arange(queries - 1, device=samples.device) < num_proposals[:, None]
    accepted = (agree & proposed).long().cumprod(dim=1).sum(dim=1)
    packed[: rows * queries].copy_(samples)
    packed[rows * queries : rows * (queries + 1)].copy_(accepted)
    packed[rows * (queries + 1) :].copy_(num_proposals)
    continues.copy_(tokens.gather(1, accepted[:, None])[:, 0])
    return continues
