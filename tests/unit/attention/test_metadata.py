"""The flat step batch: positions, slot mapping across block boundaries, padding rows."""

from __future__ import annotations

import torch

from infer.attention import ScheduledSequence, build_metadata
from infer.attention.metadata import HostBatch, host_batch


def test_prefill_across_blocks_maps_tokens_in_order() -> None:
    host = host_batch([ScheduledSequence([7, 3, 9], 0, list(range(40)))], block_size=16)
    slots = host.slot_mapping.tolist()
    assert slots[:16] == [7 * 16 + i for i in range(16)]
    assert slots[16:32] == [3 * 16 + i for i in range(16)]
    assert slots[32:] == [9 * 16 + i for i in range(8)]
    assert host.positions.tolist() == list(range(40))
    assert host.seq_lens.tolist() == [40] and host.query_start_loc.tolist() == [0, 40]


def test_decode_rows_continue_each_sequence() -> None:
    host = host_batch(
        [
            ScheduledSequence([0], 15, [1]),
            ScheduledSequence([4, 5], 16, [2]),
            ScheduledSequence([8, 9, 6], 32, [3]),
        ],
        block_size=16,
    )
    assert host.positions.tolist() == [15, 16, 32]
    assert host.slot_mapping.tolist() == [15, 5 * 16, 6 * 16]  # last slot, new block, new block
    assert host.seq_lens.tolist() == [16, 17, 33]


def test_mixed_batch_of_chunks_and_decodes() -> None:
    seqs = [
        ScheduledSequence([1, 2], 16, list(range(8))),  # a chunk resuming at position 16
        ScheduledSequence([3], 4, [9]),  # a decode
        ScheduledSequence([5, 6], 0, list(range(20))),  # a whole prompt
    ]
    input_ids, meta = build_metadata(seqs, 16, torch.device("cpu"))
    assert input_ids.tolist() == [*range(8), 9, *range(20)]
    assert meta.query_start_loc.tolist() == [0, 8, 9, 29]
    assert meta.seq_lens.tolist() == [24, 5, 20]
    assert meta.positions[:9].tolist() == [*range(16, 24), 4]
    assert meta.max_query_len == 20 and meta.max_seq_len == 24
    assert meta.block_tables.tolist() == [[1, 2], [3, 0], [5, 6]]


def test_padding_rows_hold_no_tokens_and_padding_tokens_write_nowhere() -> None:
    host = host_batch([ScheduledSequence([2], 3, [5])], 16, num_rows=4, num_tokens=6)
    assert host.query_start_loc.tolist() == [0, 1, 1, 1, 1]  # rows 1-3 are empty
    assert host.seq_lens.tolist() == [4, 0, 0, 0]
    assert host.slot_mapping.tolist() == [2 * 16 + 3, -1, -1, -1, -1, -1]
    assert host.positions.tolist() == [3, 0, 0, 0, 0, 0]
    assert host.input_ids.tolist() == [5, 0, 0, 0, 0, 0]
    assert host.block_tables.shape == (1, 1)  # an empty row never reads a table


def test_rows_are_listed_decode_first_then_prefill_then_empty() -> None:
    seqs = [
        ScheduledSequence([1, 2], 16, list(range(8))),  # prefill
        ScheduledSequence([3], 4, [9]),  # decode
        ScheduledSequence([5, 6], 0, list(range(20))),  # prefill
        ScheduledSequence([7], 2, [4]),  # decode
    ]
    host = host_batch(seqs, 16, num_rows=6, num_tokens=32)
    assert host.row_order.tolist() == [1, 3, 0, 2, 4, 5]  # batch order within each kind
    assert host.row_counts.tolist() == [2, 2]
    assert host.token_rows.tolist() == [0] * 8 + [1] + [2] * 20 + [3] + [-1, -1]
    _, meta = build_metadata(seqs, 16, torch.device("cpu"))
    assert meta.row_order.tolist() == [1, 3, 0, 2] and meta.row_counts.tolist() == [2, 2]
    assert meta.token_rows.dtype == torch.int32 and meta.token_rows.tolist()[-2:] == [2, 3]


def test_block_tables_are_as_wide_as_the_longest_table_not_the_context() -> None:
    seqs = [ScheduledSequence([1, 2, 3], 40, [7]), ScheduledSequence([4], 5, [8])]
    host = host_batch(seqs, 16, num_rows=8, num_tokens=8)
    assert host.block_tables.tolist() == [[1, 2, 3], [4, 0, 0]]


def test_a_full_graph_sized_batch_packs_exactly_its_packed_size() -> None:
    rows, width, tokens = 3, 4, 8
    seqs = [ScheduledSequence([1, 2, 3, 4], 50, [7]) for _ in range(rows)]
    host = host_batch(seqs, 16, num_rows=rows, num_tokens=tokens)
    copied = host.to_device(torch.device("cpu"))
    assert sum(v.numel() for v in copied.values()) == HostBatch.packed_size(tokens, rows, width)
