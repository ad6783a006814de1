"""Compiles the GPU kernels for each kind of step before the first request arrives.

The sampling kernel's variants (with or without top-p, a grammar mask, for each logits
dtype) are the longest compiles of the start-up (``benchmarks/results-by-topic/
10-host-overheads.md``, 10.4) and need nothing but the vocabulary, so they compile beside
the model's loading (``SamplerWarmUp``); the step kernels need the model and its pool
(``warm_up_kernels``). On a GPU both compile in processes (``compile_ahead``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

from infer.attention import ScheduledSequence, build_metadata
from infer.cache.protocol import CachePoolProtocol
from infer.kernels.compile_ahead import CompilerProcesses, compile_ahead
from infer.kernels.jit_log import JIT_LOG
from infer.kernels.sampling import RowSettings, TokenMask, sample_filtered
from infer.models import DecoderModel

SAMPLER_PART = "wait for the sampling kernels (compiled beside the loading)"


@torch.inference_mode()
def warm_up_kernels(
    model: DecoderModel,
    pool: CachePoolProtocol,
    device: torch.device,
    max_seq_len: int,
    max_rows: int,
    long_rows_from: int = 0,
    long_chunks: Sequence[int] = (),
) -> None:
    """Run a mixed step with few rows (split keys), a lone decode row, a wide mixed step, a
    chunk over a long context (the other prefill tile), the logits of every count of sampled
    rows up to ``max_rows`` and, with ``long_rows_from``, a long chunk after a prefix beside
    a decode row (the fused path and its merge), then each of ``long_chunks`` alone and after
    a prefix (cuDNN's plans for the usual long chunks): a first use would otherwise stall the
    first requests for seconds, or a long prompt's first token for ~60 ms a shape. Their K/V
    writes land in blocks that are all still free."""
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
        hidden = model(input_ids, meta)
        model.compute_logits(hidden).argmax(-1)
    warm_up_logits(model, hidden, max_rows)
    long = []  # (their hidden states are enough: all the logits of 16k tokens take GBs)
    if long_rows_from and max_seq_len > long_rows_from + block_size:
        long.append([sequence(block_size, long_rows_from), sequence(block_size, 1)])
    for chunk, prefix in itertools.product(long_chunks, (0, long_rows_from)):
        if long_rows_from and chunk >= long_rows_from and prefix + chunk <= max_seq_len:
            long.append([sequence(prefix, chunk)])
    for batch in long:
        input_ids, meta = build_metadata(batch, block_size, device, long_rows_from)
        model(input_ids, meta)
    torch.cuda.synchronize(device)


def warm_up_logits(model: DecoderModel, hidden: Tensor, max_rows: int) -> None:
    """The LM head at every row count from 1 to ``max_rows``, over hidden states shaped and
    typed as ``hidden``. An eager step's logits are one matmul of as many rows as it samples,
    and cuBLAS picks its kernel by the row count; CUDA loads a kernel at its first launch,
    and the load waits for the device to go idle, so a count first met in traffic stalled
    that step (results-by-topic 6.8)."""
    rows = hidden.new_zeros(max_rows, hidden.shape[-1])
    for count in range(1, max_rows + 1):
        model.compute_logits(rows[:count])


class SamplerWarmUp:
    """The sampling kernel's variants, compiled (or loaded from the kernel cache) in threads
    of their own from now on: with and without top-p, with and without a mask, for logits
    in ``dtype`` (as the model computes them) and widened to float32 (where the sampler
    changes them). ``wait`` before graphs are captured (no other thread may launch then)."""

    def __init__(
        self, vocab_size: int, device: torch.device, dtype: torch.dtype,
        compilers: CompilerProcesses | None = None,
    ) -> None:  # fmt: skip
        variants = list(itertools.product((1.0, 0.9), (False, True), {dtype, torch.float32}))
        self.since = len(JIT_LOG.variants)  # the variants built from here on are theirs
        self._pool = ThreadPoolExecutor(len(variants), thread_name_prefix="infer-sampler-warm-up")
        self._started = [
            self._pool.submit(_sample_once, vocab_size, device, *variant, compilers)
            for variant in variants
        ]

    def wait(self) -> None:
        """Block until every variant is built; raises what a compile raised."""
        try:
            for future in self._started:
                future.result()
        finally:
            self._pool.shutdown()

    def abandon(self) -> None:
        """The start-up failed: build no more variants (those compiling finish)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _sample_once(
    vocab_size: int, device: torch.device, top_p: float, masked: bool, dtype: torch.dtype,
    compilers: CompilerProcesses | None = None,
) -> None:  # fmt: skip
    # Every dtype named: the model's loading sets torch's default dtype meanwhile (for the
    # whole process), and a bfloat16 temperature does not compile.
    ones = torch.ones(1, dtype=torch.float32, device=device)
    ints = torch.zeros(1, dtype=torch.int64, device=device)
    rows = RowSettings(
        ones, ints + vocab_size, ones * top_p, ones * 0, ints, ints, False, top_p < 1
    )
    mask = None
    if masked:
        every_token = torch.full((1, (vocab_size + 31) // 32), -1, dtype=torch.int32)
        mask = TokenMask(every_token.to(device), torch.zeros(1, dtype=torch.int32).to(device))
    logits = torch.zeros(1, vocab_size, dtype=dtype, device=device)

    def sample() -> None:
        sample_filtered(logits, rows, mask)

    with JIT_LOG.running(SAMPLER_PART):
        compile_ahead(compilers, sample)
        sample()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
