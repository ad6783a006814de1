"""Sizing and allocating the KV cache pool from the memory left after the weights."""

from __future__ import annotations

import dataclasses
import logging
import math

import torch

from infer.attention import ScheduledSequence, build_metadata
from infer.attention.long_prefill import long_rows_from, workspace_bytes
from infer.cache.kv_tensors import KVTensors
from infer.cache.paged import PagedKVCachePool
from infer.cache.protocol import CachePoolProtocol
from infer.cache.slotted import SlottedKVCache
from infer.config import EngineConfig, ModelConfig
from infer.distributed.group import SINGLE, ParallelGroup
from infer.kernels.compile_ahead import CompilerProcesses, compile_ahead
from infer.models import DecoderModel
from infer.models.common import kv_heads_per_rank

logger = logging.getLogger(__name__)

# Without a GPU the pool is sized to at most this much host memory (unless set explicitly).
CPU_KV_CACHE_BYTES = 1 << 30


def kv_bytes_per_token(
    config: EngineConfig, model_config: ModelConfig, model_dtype: torch.dtype
) -> int:
    """Bytes one cached token takes in the pools of all ranks together: K and V of every
    layer at the cache's element size (each rank holds its KV heads, a replicated head
    once per rank)."""
    world = config.tensor_parallel_size
    heads = kv_heads_per_rank(model_config.num_kv_heads, world) * world
    itemsize = config.kv_cache_torch_dtype(model_dtype).itemsize
    return dataclasses.replace(model_config, num_kv_heads=heads).kv_bytes_per_token(itemsize)


class KVCacheBuilder:
    """Builds the pool the config asks for: contiguous slots, or as many paged blocks as
    ``num_gpu_blocks`` says or free memory allows (after a profiled worst-case step).

    Under tensor parallelism it builds this rank's share (its KV heads), with the number of
    blocks that fits on every rank, so the one scheduler's block tables are valid on all.
    After ``build``, ``max_seq_len`` is the context the pool holds (``fit_context``).
    """

    def __init__(
        self, config: EngineConfig, model_config: ModelConfig, model: DecoderModel,
        device: torch.device, dtype: torch.dtype, max_seq_len: int,
        group: ParallelGroup = SINGLE, compilers: CompilerProcesses | None = None,
    ) -> None:  # fmt: skip
        self.config = config
        self.compilers = compilers  # build the profile step's kernel variants side by side
        heads = kv_heads_per_rank(model_config.num_kv_heads, group.world_size)
        self.model_config = dataclasses.replace(model_config, num_kv_heads=heads)
        self.group = group
        self.model = model
        self.device = device
        self.dtype = config.kv_cache_torch_dtype(dtype)  # the pool's, not the model's
        self.max_seq_len = max_seq_len

    def build(self) -> tuple[CachePoolProtocol, KVTensors]:
        """The pool's bookkeeping and its K/V storage."""
        config = self.config
        block_bytes = self.model_config.kv_bytes_per_token(self.dtype.itemsize) * config.block_size
        pool: CachePoolProtocol
        if config.kv_cache_backend == "contiguous":
            available = self._available_cache_bytes()
            if config.max_seq_len is None:  # the model's context, or the slots that fit
                slot_blocks = available // config.max_batch_size // block_bytes
                self.max_seq_len = fit_context(
                    config, self.max_seq_len, slot_blocks * config.block_size
                )
            pool = SlottedKVCache.for_slots(
                config.max_batch_size, self.max_seq_len, config.block_size
            )
            self._check_fits(pool.num_blocks * block_bytes, available)
        else:
            num_blocks = config.num_gpu_blocks or self._auto_num_blocks(block_bytes)
            num_blocks = self.group.min_int(num_blocks, self.device)
            context = num_blocks * config.block_size
            self.max_seq_len = fit_context(config, self.max_seq_len, context)
            pool = PagedKVCachePool(num_blocks, config.block_size, bool(config.use_prefix_caching))
        storage = KVTensors.allocate(
            self.model_config, pool.num_blocks, config.block_size, self.dtype, self.device
        )
        return pool, storage

    def _available_cache_bytes(self) -> int:
        if self.device.type != "cuda":
            return CPU_KV_CACHE_BYTES
        peak = self._profile_activation_bytes()
        free, total = torch.cuda.mem_get_info(self.device)
        used = total - free
        return int(total * self.config.gpu_memory_utilization) - used - peak

    def _check_fits(self, need: int, available: int) -> None:
        if need > available:
            raise ValueError(
                f"max_batch_size: the contiguous cache needs {need / 2**30:.1f} GiB "
                f"({self.config.max_batch_size} slots of {self.max_seq_len} tokens) but "
                f"{available / 2**30:.1f} GiB are available; lower max_batch_size or "
                "max_seq_len, or use kv_cache_backend='paged'"
            )

    def _auto_num_blocks(self, block_bytes: int) -> int:
        available = self._available_cache_bytes()
        if self.device.type != "cuda":
            seeds_default = self.config.max_batch_size * self.max_seq_len // self.config.block_size
            return max(1, min(seeds_default, available // block_bytes))
        num_blocks = available // block_bytes
        if num_blocks < 1:
            raise ValueError("gpu_memory_utilization: no memory is left for the KV cache")
        logger.info("KV cache: %d blocks (%.1f GiB)", num_blocks, num_blocks * block_bytes / 2**30)
        return num_blocks

    @torch.inference_mode()
    def _profile_activation_bytes(self) -> int:
        """Peak memory of the largest step (a long prompt's step budget and a decode row
        for every other request, plus sampling of a full batch)."""
        config = self.config
        budget = config.resolved_long_prefill_step_tokens(self.max_seq_len) + config.max_batch_size
        seq_len = min(budget, self.max_seq_len)
        blocks_per_seq = math.ceil(seq_len / config.block_size)
        num_seqs = math.ceil(budget / seq_len)
        scratch = KVTensors.allocate(
            self.model_config, blocks_per_seq * num_seqs, config.block_size, self.dtype, self.device
        )
        self.model.bind_kv_cache(scratch.k, scratch.v)
        seqs = [
            ScheduledSequence(
                list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)), 0, [0] * seq_len
            )
            for i in range(num_seqs)
        ]

        def step() -> None:
            input_ids, meta = build_metadata(seqs, config.block_size, self.device)
            hidden = self.model(input_ids, meta)
            self.model.compute_logits(hidden[: config.max_batch_size])

        compile_ahead(self.compilers, step)
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        start = torch.cuda.memory_allocated(self.device)
        step()
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - start
        del scratch
        torch.cuda.empty_cache()
        sampling = 4 * config.max_batch_size * self.model_config.vocab_size * 4
        long_rows = 0
        if long_rows_from(config.use_sdpa_prefill, self.device):  # a long row's context
            shape = self.model_config  # every rank's heads: an upper bound under TP
            heads = (shape.num_heads, shape.num_kv_heads, shape.head_dim)
            long_rows = workspace_bytes(heads, self.max_seq_len, budget, self.dtype.itemsize)
        return peak + sampling + long_rows


def fit_context(config: EngineConfig, max_seq_len: int, capacity: int) -> int:
    """The longest sequence the KV cache can hold: ``max_seq_len`` when ``capacity`` tokens
    hold it; the model's context lowered to ``capacity`` (said once in the log) when no
    ``max_seq_len`` was asked for; a ``ValueError`` when an explicit one does not fit."""
    if max_seq_len <= capacity:
        return max_seq_len
    if config.max_seq_len is not None or capacity < 2:
        raise ValueError(
            f"max_seq_len: {max_seq_len} tokens do not fit the KV cache, which holds at most "
            f"{capacity}; lower max_seq_len or give the cache more memory "
            "(gpu_memory_utilization, num_gpu_blocks)"
        )
    logger.info(
        "max_seq_len: %d, what the KV cache holds (the model's context, %d, does not fit)",
        capacity,
        max_seq_len,
    )
    return capacity
