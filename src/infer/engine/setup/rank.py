"""What every rank builds before the first step: its share of the model, its share of the
KV pool, and the runner (with CUDA graphs when they apply).

Rank 0 (the engine) and the tensor-parallel workers call the same function, so the
collectives of the steps it runs (the pool's sizing, the profile and warm-up forwards, the
graph captures) happen in the same order on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from infer.attention.flash_attn4 import import_in_background
from infer.attention.long_prefill import long_rows_from
from infer.cache.protocol import CachePoolProtocol
from infer.config import EngineConfig, ModelConfig
from infer.distributed.group import ParallelGroup
from infer.engine.core.cuda_graphs import CUDAGraphRunner
from infer.engine.core.runner import ModelRunner
from infer.engine.core.scheduler import LONG_CHUNK_ALIGN
from infer.engine.setup.memory import KVCacheBuilder
from infer.engine.setup.start_up_log import start_up_part
from infer.engine.setup.warmup import SAMPLER_PART, SamplerWarmUp, warm_up_kernels
from infer.engine.speculative.token_history import TokenHistory
from infer.kernels.compile_ahead import CompilerProcesses, compile_ahead
from infer.kernels.dispatch import triton_enabled
from infer.kernels.jit_cache import use_kernel_cache
from infer.kernels.jit_log import JIT_LOG
from infer.kernels.paged_attention import max_decode_queries
from infer.kernels.verify_inputs import VerifyShape
from infer.loader import ModelSource, load_model
from infer.models import DecoderModel


@dataclass
class RankState:
    model: DecoderModel
    pool: CachePoolProtocol
    runner: ModelRunner
    max_seq_len: int  # the context the pool holds (at most the one asked for)


def build_rank(
    config: EngineConfig,
    source: ModelSource,
    model_config: ModelConfig,
    max_seq_len: int,
    device: torch.device,
    group: ParallelGroup,
) -> RankState:
    """Load this rank's model and pool, warm up and capture graphs on a GPU; each part is
    timed in the start-up log (rank 0's), with the kernel variants it built."""
    use_kernel_cache()
    JIT_LOG.install()
    long_rows = long_rows_from(config.use_sdpa_prefill, device)
    if long_rows:
        import_in_background(device)
    log = group.rank == 0
    dtype = config.torch_dtype
    # Every rank runs the same recorded stretches (their collectives), so every rank has
    # its compilers; the ranks of one host share its cores.
    compilers = CompilerProcesses.for_device(device, min(group.world_size, _gpus_here()))
    sampler = None  # only rank 0 samples
    if device.type == "cuda" and group.rank == 0:
        sampler = SamplerWarmUp(model_config.vocab_size, device, dtype, compilers)
    try:
        with start_up_part(f"{source.name}: load the weights", log=log):
            model, _ = load_model(
                source, device, dtype, max_seq_len, config.load_format, config.seed, group,
                config.quantization,
            )  # fmt: skip
        with start_up_part(f"{source.name}: size the KV cache", log=log):
            builder = KVCacheBuilder(
                config, model_config, model, device, dtype, max_seq_len, group, compilers
            )
            pool, storage = builder.build()
        max_seq_len = builder.max_seq_len
        verify = verify_shape(config, model_config, group)
        history = None
        if verify is not None:
            history = TokenHistory(pool.num_blocks, config.block_size, device)
        graphs = None
        # Graphs capture the Triton kernels; the torch attention path is the eager reference.
        if config.cuda_graphs_enabled and triton_enabled(device):
            graph_tokens = min(
                config.max_graph_tokens, config.resolved_max_num_batched_tokens(max_seq_len)
            )
            graphs = CUDAGraphRunner(
                model, config.block_size, config.max_batch_size, max_seq_len, graph_tokens, device,
                verify, history,
            )  # fmt: skip
        runner = ModelRunner(
            model, pool, storage, device, max_seq_len, graphs, group, long_rows, verify, history
        )
        if device.type == "cuda":
            with start_up_part(f"{source.name}: warm up the step kernels", log=log):
                chunks = _long_chunks(config, max_seq_len)

                def warm_up() -> None:
                    warm_up_kernels(
                        model, pool, device, max_seq_len, config.max_batch_size, long_rows, chunks
                    )

                compile_ahead(compilers, warm_up)
                warm_up()
    except BaseException:
        if sampler is not None:
            sampler.abandon()
        if compilers is not None:
            compilers.close()
        raise
    if sampler is not None:  # before graphs are captured: no other thread may launch then
        with start_up_part(SAMPLER_PART, since=sampler.since):
            sampler.wait()
    if compilers is not None:
        compilers.close()
    if graphs is not None:
        with start_up_part(
            f"{source.name}: capture {len(graphs.buckets)} CUDA graphs", log=log
        ):  # with NCCL, each graph holds its forward's all-reduces
            graphs.capture()
        graphs.measure_verify_costs()
    return RankState(model, pool, runner, max_seq_len)


def _gpus_here() -> int:
    return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1


def _long_chunks(config: EngineConfig, max_seq_len: int) -> tuple[int, ...]:
    """A long prompt's usual chunks: a whole long-prompt step, and one less the alignment
    (beside another prompt's chunk); none under the fixed-chunk policy."""
    if config.long_prefill_threshold == 0 or not config.use_chunked_prefill:
        return ()
    step = config.resolved_long_prefill_step_tokens(max_seq_len)
    return (step, step - LONG_CHUNK_ALIGN)


def verify_shape(
    config: EngineConfig, model_config: ModelConfig, group: ParallelGroup
) -> VerifyShape | None:
    """How verify steps run n-gram proposals made on the device (``verify_step``); None
    where they cannot: no n-gram speculation, several ranks (only rank 0 samples), or more
    proposals than a decode row's tile holds."""
    spec = config.speculative_config
    if spec is None or spec.method != "ngram" or group.world_size > 1:
        return None
    queries = spec.num_speculative_tokens + 1
    if queries > max_decode_queries(model_config.num_heads // model_config.num_kv_heads):
        return None
    return VerifyShape(queries, spec.prompt_lookup_min, spec.prompt_lookup_max)
