"""A step that verifies proposals made on the device (``Step.verify_queries``).

Every row runs ``Q`` tokens: the sample it continues from and up to ``Q - 1`` proposals that
``kernels.verify_inputs`` finds in the row's own tokens (``TokenHistory``), through the
decode attention path (``decode_queries``): on a GPU one captured graph per bucket of rows.

The host knows where a row starts only up to what the step in flight will accept: it sends
its own view (``base``, as if that step kept one token) and the previous step's row that
feeds this one; the device adds that row's accepted count and takes the sample it ended on
as the first token (``load_rows``). After sampling, ``accept_proposals`` counts on the
device how many proposals stand and which sample the next step continues from, so the next
step can be queued before this one's tokens reach the host, as a plain decode step is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from infer.attention import AttentionMetadata
from infer.kernels.verify_inputs import ProposalMode, RowStarts, VerifyInputs

# Verify graphs hold at most this many tokens (rows x Q): wider steps are compute-bound,
# where checking proposals costs more than they save.
MAX_VERIFY_TOKENS = 256


@dataclass
class VerifyPlan:
    """A verify step's rows as the host knows them: block tables, and where each row starts
    as if the step in flight kept one token; ``sources``: the row of the previous step that
    feeds each (every row is fed, or none: its first token is then ``first``)."""

    tables: list[list[int]]
    first: list[int]
    base: list[int]
    limits: list[int]
    sources: list[int] | None
    mode: ProposalMode


@dataclass
class VerifyOutputs:
    """What sampling a verify step needs besides its logits: the tokens it ran, how many
    of each row's were proposals, and ``extra``: per row, the tokens the step before it
    accepted beyond what the host assumed (output indices shift by them)."""

    input_ids: Tensor  # [R * Q]
    num_proposals: Tensor  # [R] int32
    extra: Tensor  # [R] int64
    queries: int


def load_rows(
    plan: VerifyPlan,
    previous: tuple[Tensor, Tensor | None] | None,
    rows: RowStarts,
    extra: Tensor,
    block_tables: Tensor,
    staging: Tensor | None = None,
) -> None:
    """Copy ``plan`` to the device in one transfer (through ``staging`` when given) into
    ``rows``, ``extra`` and ``block_tables`` (a graph's buffers, or fresh ones): fed rows
    take their first token from the previous step's ``(samples it continues from, accepted
    counts)`` and start past what it accepted (accepted None: a plain step, which keeps one
    token)."""
    count = len(plan.first)
    width = max(len(t) for t in plan.tables)
    tables = np.zeros((count, width), dtype=np.int64)
    for row, table in enumerate(plan.tables):
        tables[row, : len(table)] = table
    arrays = [
        np.array([count, 0, int(plan.mode)]),
        np.asarray(plan.limits),
        np.asarray(plan.first),
        np.asarray(plan.base),
        np.asarray(plan.sources or [], dtype=np.int64),
        tables.ravel(),
    ]
    packed = torch.from_numpy(np.concatenate(arrays).astype(np.int64))
    if staging is None:
        staged = packed.to(block_tables.device, non_blocking=True)
    else:
        staged = staging[: packed.numel()]
        staged.copy_(packed, non_blocking=True)
    head, limits, first, base, sources, flat = torch.split(staged, [a.size for a in arrays])
    rows.num_rows.copy_(head[:2])
    rows.mode.copy_(head[2:])
    rows.limit.copy_(limits)
    block_tables[:count, :width].copy_(flat.view(count, width))
    if plan.sources is None:
        rows.first.copy_(first)
        rows.base.copy_(base)
        extra.zero_()
        return
    assert previous is not None
    samples, accepted = previous
    torch.index_select(samples, 0, sources, out=rows.first)
    if accepted is None:
        rows.base.copy_(base)
        extra.zero_()
    else:
        torch.index_select(accepted, 0, sources, out=extra)
        torch.add(base, extra, out=rows.base)


def new_rows(count: int, device: torch.device) -> tuple[RowStarts, Tensor]:
    """Fresh device buffers for ``load_rows`` (an eager step): rows and ``extra``."""
    int64, int32 = torch.int64, torch.int32
    first = torch.empty(count, dtype=int64, device=device)
    rows = RowStarts(
        first=first,
        base=torch.empty(count, dtype=int64, device=device),
        limit=torch.empty(count, dtype=int32, device=device),
        mode=torch.empty(1, dtype=int32, device=device),
        given=first.view(count, 1),  # (read only in mode GIVEN)
        num_rows=torch.empty(2, dtype=int32, device=device),
    )
    return rows, torch.empty(count, dtype=int64, device=device)


def empty_inputs(rows: int, queries: int, device: torch.device) -> VerifyInputs:
    tokens = rows * queries
    return VerifyInputs(
        input_ids=torch.empty(tokens, dtype=torch.int64, device=device),
        positions=torch.empty(tokens, dtype=torch.int64, device=device),
        slot_mapping=torch.empty(tokens, dtype=torch.int64, device=device),
        seq_lens=torch.empty(rows, dtype=torch.int32, device=device),
        num_proposals=torch.empty(rows, dtype=torch.int32, device=device),
    )


def row_layout(num_rows: Tensor, rows: int, queries: int) -> tuple[Tensor, Tensor, Tensor]:
    """Where the first ``num_rows[0]`` of ``rows`` rows of ``queries`` tokens sit in the
    flat batch (the rest pad a graph's bucket): ``query_start_loc``, ``row_order`` and
    ``token_rows``, made on the device (a graph makes them on every replay)."""
    device = num_rows.device
    index = torch.arange(rows + 1, dtype=torch.int32, device=device)
    count = num_rows[:1]
    tokens = torch.arange(rows * queries, dtype=torch.int32, device=device)
    owners = torch.where(tokens < count * queries, tokens // queries, -1)
    return torch.minimum(index, count) * queries, index[:rows], owners


def verify_metadata(
    inputs: VerifyInputs, rows: RowStarts, block_tables: Tensor, queries: int, max_seq_len: int
) -> AttentionMetadata:
    """The attention metadata of an eager verify step (a graph's buffers hold the same)."""
    starts, order, owners = row_layout(rows.num_rows, block_tables.shape[0], queries)
    return AttentionMetadata(
        block_tables=block_tables,
        seq_lens=inputs.seq_lens,
        query_start_loc=starts,
        max_query_len=queries,
        max_seq_len=max_seq_len,
        decode_queries=queries,
        positions=inputs.positions,
        slot_mapping=inputs.slot_mapping,
        row_order=order,
        row_counts=rows.num_rows,
        token_rows=owners,
    )
