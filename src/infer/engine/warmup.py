"""Compiles the GPU kernels for each kind of step before the first request arrives."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch

from infer.attention import ScheduledSequence, build_metadata
from infer.cache.protocol import CachePoolProtocol
from infer.kernels.sampling import RowSettings, TokenMask, sample_filtered
from infer.models import DecoderModel


@torch.inference_mode()
def warm_up_kernels(
    model: DecoderModel,
    pool: CachePoolProtocol,
    device: torch.device,
    max_seq_len: int,
    long_rows_from: int = 0,
    long_chunks: Sequence[int] = (),
) -> None:
    """Run a mixed step with few rows (split keys), a lone decode row, a wide mixed step, a
    chunk over a long context (the other prefill tile) and, with ``long_rows_from``, a long
    chunk after a prefix beside a decode row (the fused path and its merge), then each of
    ``long_chunks`` alone and after a prefix (cuDNN's plans for the usual long chunks): a
    first use would otherwise stall the first requests for seconds, or a long prompt's first
    token for ~60 ms a shape. Their K/V writes land in blocks that are all still free."""
    from infer.kernels.paged_attention import SHORT_PREFILL_LEN  # triton: GPU installs only

    block_size = pool.block_size
    blocks = itertools.cycle(range(pool.num_blocks))

    def sequence(computed: int, new: int) -> ScheduledSequence:
        count = math.ceil((computed + new) / block_size)
        return ScheduledSequence([next(blocks) for _ in range(count)], computed, [0] * new)

    batches = [
        [sequence(0, 2 * block_size), sequence(block_size, 1)],
        [sequence(block_size, 1)],
        [sequence(0, 8) for _ in range(32)] + [sequence(block_size, 1) for _ in range(32)],
    ]
    if max_seq_len > SHORT_PREFILL_LEN + 2:
        batches.append([sequence(SHORT_PREFILL_LEN, 2)])
    for batch in batches:
        input_ids, meta = build_metadata(batch, block_size, device)
        logits = model.compute_logits(model(input_ids, meta))
        logits.argmax(-1)
    long = []  # (their hidden states are enough: all the logits of 16k tokens take GBs)
    if long_rows_from and max_seq_len > long_rows_from + block_size:
        long.append([sequence(block_size, long_rows_from), sequence(block_size, 1)])
    for chunk, prefix in itertools.product(long_chunks, (0, long_rows_from)):
        if long_rows_from and chunk >= long_rows_from and prefix + chunk <= max_seq_len:
            long.append([sequence(prefix, chunk)])
    for batch in long:
        input_ids, meta = build_metadata(batch, block_size, device, long_rows_from)
        model(input_ids, meta)
    _warm_up_sampler(model.config.vocab_size, device, {logits.dtype, torch.float32})
    torch.cuda.synchronize(device)


def _warm_up_sampler(vocab_size: int, device: torch.device, dtypes: set[torch.dtype]) -> None:
    """The sampling kernel's variants: with and without top-p, with and without a mask, for
    logits as the model computes them and widened (where the sampler changes them)."""
    words = (vocab_size + 31) // 32
    every_token = torch.full((1, words), -1, dtype=torch.int32, device=device)
    mask = TokenMask(every_token, torch.zeros(1, dtype=torch.int32, device=device))
    ones = torch.ones(1, device=device)
    ints = torch.zeros(1, dtype=torch.int64, device=device)
    for top_p in (1.0, 0.9):
        rows = RowSettings(
            ones, ints + vocab_size, ones * top_p, ones * 0, ints, ints, False, top_p < 1
        )
        for masked, dtype in itertools.product((None, mask), dtypes):
            sample_filtered(torch.zeros(1, vocab_size, dtype=dtype, device=device), rows, masked)
