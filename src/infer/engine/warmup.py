"""Compiles the GPU kernels for each kind of step before the first request arrives."""

from __future__ import annotations

import itertools
import math

import torch

from infer.attention import ScheduledSequence, build_metadata
from infer.cache.protocol import CachePoolProtocol
from infer.models import DecoderModel


@torch.inference_mode()
def warm_up_kernels(
    model: DecoderModel, pool: CachePoolProtocol, device: torch.device, max_seq_len: int
) -> None:
    """Run a mixed step with few rows (split keys), a lone decode row, a wide mixed step and
    a chunk over a long context (the other prefill tile): a first-use compile would otherwise
    stall the first requests for seconds. Their K/V writes land in blocks that are all still
    free."""
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
        model.compute_logits(model(input_ids, meta)).argmax(-1)
    torch.cuda.synchronize(device)
