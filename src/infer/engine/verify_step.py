"""A step that verifies proposals made on the device (``SchedulerOutput.verify_queries``).

Every row runs ``Q`` tokens: the sample it continues from and up to ``Q - 1`` proposals that
``kernels.verify_inputs`` finds in the row's own tokens (``TokenHistory``), through the
decode attention path (``decode_queries``): on a GPU one captured graph per bucket of rows.

The host knows where a row starts only up to what the step in flight will accept: it sends
its own view (``base``, as if that step kept one token) and the previous step's row that
feeds this one; the device adds that row's accepted count and takes the sample it ended on
as the first token. After sampling, ``accept`` counts on the device how many proposals
stand and which sample the next step continues from, so the next step can be queued before
this one's tokens reach the host, as a plain decode step is.
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


@dataclass(frozen=True)
class VerifyShape:
    """Tokens a verify row runs (``queries``: the proposals plus one) and the n-gram sizes
    its lookup tries."""

    queries: int
    min_n: int
    max_n: int


@dataclass
class VerifyRows:
    """A verify step's rows on the device (``starts``) and, per row, the tokens the step
    before it accepted beyond what the host assumed (``extra``: shifts positions and the
    output indices that seeded rows draw their noise from)."""

    starts: RowStarts
    extra: Tensor  # [R] int64


@dataclass
class VerifyOutputs:
    """What sampling a verify step needs besides its logits: the tokens it ran, how many
    of each row's were proposals, and each row's ``extra``."""

    input_ids: Tensor  # [R * Q]
    num_proposals: Tensor  # [R] int32
    extra: Tensor  # [R] int64
    queries: int


def plan_rows(
    first: list[int],
    base: list[int],
    limits: list[int],
    fed: list[tuple[int, int]],
    previous: tuple[Tensor, Tensor | None] | None,
    mode: ProposalMode,
    device: torch.device,
) -> VerifyRows:
    """The rows on the device from the host's view of them (one copy): ``fed`` pairs (row,
    previous row) take their first token from the previous step's ``(samples it continues
    from, accepted counts)`` (accepted None: a plain step, which keeps one token)."""
    count = len(first)
    destinations = [row for row, _ in fed]
    sources = [source for _, source in fed]
    packed = np.array(
        [count, int(mode), *first, *base, *limits, *destinations, *sources], dtype=np.int64
    )
    values = torch.from_numpy(packed).to(device, non_blocking=True)
    header, firsts, bases, limit, dst, src = torch.split(
        values, [2, count, count, count, len(fed), len(fed)]
    )
    firsts, bases = firsts.clone(), bases.clone()  # (views of one copy: written below)
    extra = torch.zeros(count, dtype=torch.int64, device=device)
    if fed:
        assert previous is not None
        samples, accepted = previous
        firsts[dst] = samples[src]
        if accepted is not None:
            extra[dst] = accepted[src]
            bases += extra
    starts = RowStarts(
        first=firsts,
        base=bases,
        limit=limit.int(),
        mode=header[1:].int(),
        given=torch.zeros(count, 1, dtype=torch.int64, device=device),
        num_rows=header[:1].int(),
    )
    return VerifyRows(starts, extra)


def empty_inputs(rows: int, queries: int, device: torch.device) -> VerifyInputs:
    tokens = rows * queries
    return VerifyInputs(
        input_ids=torch.empty(tokens, dtype=torch.int64, device=device),
        positions=torch.empty(tokens, dtype=torch.int64, device=device),
        slot_mapping=torch.empty(tokens, dtype=torch.int64, device=device),
        seq_lens=torch.empty(rows, dtype=torch.int32, device=device),
        num_proposals=torch.empty(rows, dtype=torch.int32, device=device),
    )


def verify_metadata(
    inputs: VerifyInputs, block_tables: Tensor, queries: int, max_seq_len: int
) -> AttentionMetadata:
    """The attention metadata of an eager verify step (a graph's buffers hold the same)."""
    rows = block_tables.shape[0]
    device = block_tables.device
    order = torch.arange(rows + 1, dtype=torch.int32, device=device)
    return AttentionMetadata(
        block_tables=block_tables,
        seq_lens=inputs.seq_lens,
        query_start_loc=order * queries,
        max_query_len=queries,
        max_seq_len=max_seq_len,
        decode_queries=queries,
        positions=inputs.positions,
        slot_mapping=inputs.slot_mapping,
        row_order=order[:rows],
        row_counts=torch.tensor([rows, 0], dtype=torch.int32, device=device),
        token_rows=torch.arange(rows * queries, dtype=torch.int32, device=device) // queries,
    )


def accept(
    samples: Tensor, input_ids: Tensor, num_proposals: Tensor, queries: int
) -> tuple[Tensor, Tensor]:
    """Per row: how many proposals stand (each while it equals the sample before it, as
    ``speculation.accepted_length``) and the sample after the last that stands, which the
    next step continues from."""
    samples = samples.view(-1, queries)
    agree = samples[:, :-1] == input_ids.view(-1, queries)[:, 1:]
    proposed = torch.arange(queries - 1, device=samples.device) < num_proposals[:, None]
    accepted = (agree & proposed).long().cumprod(dim=1).sum(dim=1)
    return accepted, samples.gather(1, accepted[:, None])[:, 0]
