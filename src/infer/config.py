"""Engine and model configuration.

``EngineConfig`` holds every switch the engine has (each optimisation is a flag that can be
turned off); ``ModelConfig`` is the architecture description read from a Hugging Face
``config.json`` or from GGUF metadata.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from infer.speculative_config import SpeculativeConfig

SUPPORTED_MODEL_TYPES = ("llama", "qwen3", "gemma3_text", "gemma3")
BatchingMode = Literal["static", "continuous"]
KVCacheBackend = Literal["contiguous", "paged"]
if TYPE_CHECKING:
    import torch

_DTYPES = ("float32", "float16", "bfloat16")  # torch's names
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")
logger = logging.getLogger(__name__)
# transformers' Gemma3TextConfig defaults: a multimodal checkpoint's ``text_config`` lists
# only what differs from them (gemma-3-4b-it: hidden size, layers, RoPE scaling, window).
_GEMMA3_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
    "tie_word_embeddings": True,
    "bos_token_id": 2,
    "eos_token_id": 1,
}


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding of one attention kind (Gemma 3 has a local and a global one)."""

    theta: float
    rope_type: str = "default"  # default | linear | llama3 | yarn
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int = 8192
    beta_fast: float = 32.0  # yarn: the ramp between extrapolated and interpolated dimensions
    beta_slow: float = 1.0
    truncate: bool = True  # yarn: the ramp's ends rounded to whole dimensions
    attention_factor: float = 1.0  # yarn: scales cos and sin (so q·k by its square)

    @classmethod
    def from_hf(
        cls, theta: float, scaling: dict[str, Any] | None, max_positions: int = 8192
    ) -> RopeConfig:
        """From a config's ``rope_scaling`` (or ``rope_parameters``); ``max_positions``: the
        config's ``max_position_embeddings`` (YaRN's defaults derive from it)."""
        if not scaling:
            return cls(theta=theta)
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type not in ("default", "linear", "llama3", "yarn"):
            raise ValueError(
                f"rope_scaling: type {rope_type!r} is not supported (default, linear, llama3, yarn)"
            )
        theta = float(scaling.get("rope_theta", theta))
        if rope_type == "yarn":
            return cls._yarn(theta, scaling, max_positions)
        return cls(
            theta=theta,
            rope_type=rope_type,
            factor=float(scaling.get("factor", 1.0)),
            low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
            high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(
                scaling.get("original_max_position_embeddings", 8192)
            ),
        )

    @classmethod
    def _yarn(cls, theta: float, scaling: dict[str, Any], max_positions: int) -> RopeConfig:
        """YaRN as transformers reads it: the factor defaults to the context's growth over
        the pretrained one, the attention factor to ``0.1 ln(factor) + 1`` (or DeepSeek's
        ratio of two such terms when ``mscale`` and ``mscale_all_dim`` are given)."""
        original = int(scaling.get("original_max_position_embeddings") or max_positions)
        factor = float(scaling.get("factor") or max_positions / original)
        attention_factor = scaling.get("attention_factor")
        if attention_factor is None:
            mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
            if mscale and mscale_all_dim:
                attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(
                    factor, mscale_all_dim
                )
            else:
                attention_factor = _yarn_mscale(factor)
        return cls(
            theta=theta,
            rope_type="yarn",
            factor=factor,
            original_max_position_embeddings=original,
            beta_fast=float(scaling.get("beta_fast") or 32.0),
            beta_slow=float(scaling.get("beta_slow") or 1.0),
            truncate=bool(scaling.get("truncate", True)),
            attention_factor=float(attention_factor),
        )


def cache_dir() -> Path:
    """Where infer keeps what it converts or compiles once for later runs (tokenizers,
    kernels): ``INFER_CACHE_DIR``, or ``~/.cache/infer``."""
    root = os.environ.get("INFER_CACHE_DIR") or Path.home() / ".cache" / "infer"
    return Path(root)


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder-only model (Llama 3.x, Qwen3 or Gemma 3)."""

    model_type: str  # llama | qwen3 | gemma3_text
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    hidden_act: str = "silu"
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # Gemma 3: per-layer attention kind, window, local RoPE, attention scale.
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    local_rope: RopeConfig | None = None
    query_pre_attn_scalar: float | None = None
    torch_dtype: str = "bfloat16"

    @property
    def is_gemma(self) -> bool:
        return self.model_type == "gemma3_text"

    def window_of_layer(self, layer: int) -> int:
        """Sliding window of a layer in tokens; 0 means full attention."""
        if self.layer_types and self.layer_types[layer] == "sliding_attention":
            return int(self.sliding_window or 0)
        return 0

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Bytes of K and V one token occupies across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Parse a Hugging Face ``config.json`` (transformers 4.x or 5.x spelling)."""
        model_type = raw.get("model_type")
        if model_type == "gemma3":  # multimodal wrapper: the language model is text_config
            # The wrapper's own token ids (gemma-3-4b-it: eos [1, 106]) are the generation's.
            ids = {k: raw[k] for k in ("bos_token_id", "eos_token_id") if raw.get(k) is not None}
            raw = {**raw.get("text_config", {}), **ids}
            model_type = "gemma3_text"
        if model_type == "gemma3_text":
            raw = {**_GEMMA3_TEXT_DEFAULTS, **raw, "model_type": model_type}
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r}; supported: "
                + ", ".join(SUPPORTED_MODEL_TYPES)
            )
        if model_type == "qwen3" and raw.get("use_sliding_window"):
            raise ValueError("Qwen3 with use_sliding_window=true is not supported")
        hidden = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        head_dim = int(raw.get("head_dim") or hidden // heads)
        global_rope, local_rope = _parse_rope(raw, model_type)
        layers = int(raw["num_hidden_layers"])
        layer_types: tuple[str, ...] = ()
        if model_type == "gemma3_text":
            layer_types = _gemma_layer_types(raw, layers)
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            model_type=model_type,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope=global_rope,
            max_position_embeddings=int(raw.get("max_position_embeddings", 8192)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            hidden_act=str(raw.get("hidden_activation") or raw.get("hidden_act") or "silu"),
            attention_bias=bool(raw.get("attention_bias", False)),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
            layer_types=layer_types,
            sliding_window=raw.get("sliding_window") if model_type == "gemma3_text" else None,
            local_rope=local_rope,
            query_pre_attn_scalar=raw.get("query_pre_attn_scalar"),
            torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "bfloat16"),
        )


def _parse_rope(raw: dict[str, Any], model_type: str) -> tuple[RopeConfig, RopeConfig | None]:
    """Global (and for Gemma 3, local) RoPE from either config spelling."""
    params = raw.get("rope_parameters")
    positions = int(raw.get("max_position_embeddings") or 8192)
    if model_type == "gemma3_text":
        if isinstance(params, dict) and "full_attention" in params:
            full, sliding = params["full_attention"], params["sliding_attention"]
            return (
                RopeConfig.from_hf(float(full["rope_theta"]), full, positions),
                RopeConfig.from_hf(float(sliding["rope_theta"]), sliding, positions),
            )
        theta = float(raw.get("rope_theta", 1_000_000.0))
        local = RopeConfig(theta=float(raw.get("rope_local_base_freq", 10_000.0)))
        return RopeConfig.from_hf(theta, raw.get("rope_scaling"), positions), local
    if isinstance(params, dict) and "rope_theta" in params:
        return RopeConfig.from_hf(float(params["rope_theta"]), params, positions), None
    theta = float(raw.get("rope_theta", 10_000.0))
    return RopeConfig.from_hf(theta, raw.get("rope_scaling"), positions), None


def _gemma_layer_types(raw: dict[str, Any], layers: int) -> tuple[str, ...]:
    if raw.get("layer_types"):
        return tuple(raw["layer_types"])
    pattern = int(raw.get("sliding_window_pattern", 6))
    return tuple(
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
    )


# Tokens a step by default, and for a step with a long prompt's chunk (benchmarks/
# results-by-topic/14-long-context.md): a 16k prompt then takes one step beside decode rows,
# as in vLLM's offline default.
DEFAULT_STEP_TOKENS = 8192
LONG_PREFILL_STEP_TOKENS = 16384


@dataclass
class EngineConfig:
    """Every engine option; each optimisation is a flag (CLI: ``--kebab-case`` of the name).

    ``None`` means "choose for the machine": the device is CUDA when available, the dtype is
    bfloat16 on CUDA and float32 on CPU, CUDA graphs are on exactly when the device is CUDA,
    ``max_seq_len`` is the model's whole context (lowered to what the KV cache holds when it
    holds less), and ``num_gpu_blocks`` is sized from free device memory
    (``gpu_memory_utilization``) after the weights are loaded.

    ``None`` also means "follow the other choices" for the fields that depend on them, and
    those are filled in at construction (so readers always see a value): static batching
    picks the contiguous cache, and static batching or the contiguous cache turn chunked
    prefill / prefix caching off. Only contradictions between explicit values raise.
    """

    model: str = "smollm2-135m"
    load_format: Literal["auto", "dummy", "safetensors", "gguf"] = "auto"
    tokenizer: str | None = None
    batching_mode: BatchingMode = "continuous"
    kv_cache_backend: KVCacheBackend | None = None  # paged; contiguous when static
    block_size: int = 16
    num_gpu_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    max_batch_size: int = 256
    max_seq_len: int | None = None
    max_num_batched_tokens: int | None = None
    max_waiting_requests: int = 4096
    admission_reserve: float = 0.2
    use_chunked_prefill: bool | None = None  # on; off when static
    prefill_chunk_size: int = 256
    long_prefill_threshold: int = 4096
    max_prefill_chunks_per_step: int | None = None
    use_prefix_caching: bool | None = None  # on; off when static or contiguous
    use_cuda_graphs: bool | None = None
    max_graph_tokens: int = 2048
    use_warm_up: bool | None = None  # the first traffic rehearsed before ready; on with CUDA
    use_sdpa_prefill: bool = True
    use_async_scheduling: bool = True
    use_launch_pacing: bool = True
    tensor_parallel_size: int = 1
    # The ranks over several nodes (torchrun's convention, ``distributed/layout.py``).
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None  # one node: a free port; several: torchrun's default
    dist_timeout: float = 120.0
    quantization: str | None = None  # fp8: weights quantised at load (FP8 checkpoints: as is)
    kv_cache_dtype: str = "auto"  # auto: the model's dtype; fp8: e4m3, a scale per tensor
    # A dict or its JSON text is parsed at construction (the CLI's and ``LLM``'s shapes).
    speculative_config: SpeculativeConfig | None = None
    dtype: str | None = None
    device: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        spec: object = self.speculative_config
        if isinstance(spec, dict | str):
            self.speculative_config = SpeculativeConfig.parse(spec)
        self._resolve_dependent_defaults()
        self.validate()

    def _resolve_dependent_defaults(self) -> None:
        """Fill the ``None`` fields that follow other choices, and say so when a choice
        turned something off that is on by default."""
        static = self.batching_mode == "static"
        adapted = []
        if self.kv_cache_backend is None:
            self.kv_cache_backend = "contiguous" if static else "paged"
            if static:
                adapted.append("kv_cache_backend='contiguous'")
        if self.use_chunked_prefill is None:
            self.use_chunked_prefill = not static
            if static:
                adapted.append("use_chunked_prefill=False")
        if self.use_prefix_caching is None:
            self.use_prefix_caching = self.kv_cache_backend == "paged"
            if not self.use_prefix_caching:
                adapted.append("use_prefix_caching=False")
        if adapted:
            reason = (
                "batching_mode='static'"
                if static
                else f"kv_cache_backend={self.kv_cache_backend!r}"
            )
            logger.info("%s: defaulting to %s", reason, ", ".join(adapted))

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def validate(self) -> None:
        """Raise ``ValueError`` naming the flag for any invalid value or combination."""
        _check(
            self.batching_mode in ("static", "continuous"),
            "batching_mode",
            f"must be 'static' or 'continuous', got {self.batching_mode!r}",
        )
        _check(
            self.kv_cache_backend in ("contiguous", "paged"),
            "kv_cache_backend",
            f"must be 'contiguous' or 'paged', got {self.kv_cache_backend!r}",
        )
        _check(
            self.load_format in ("auto", "dummy", "safetensors", "gguf"),
            "load_format",
            f"must be auto, dummy, safetensors or gguf, got {self.load_format!r}",
        )
        _check(self.block_size >= 1, "block_size", f"must be >= 1, got {self.block_size}")
        _check(
            self.num_gpu_blocks is None or self.num_gpu_blocks >= 1,
            "num_gpu_blocks",
            f"must be >= 1, got {self.num_gpu_blocks}",
        )
        _check(
            0.0 < self.gpu_memory_utilization <= 1.0,
            "gpu_memory_utilization",
            f"must be in (0, 1], got {self.gpu_memory_utilization}",
        )
        _check(
            self.max_batch_size >= 1, "max_batch_size", f"must be >= 1, got {self.max_batch_size}"
        )
        _check(
            self.max_seq_len is None or self.max_seq_len >= 2,
            "max_seq_len",
            f"must be >= 2, got {self.max_seq_len}",
        )
        _check(
            self.max_num_batched_tokens is None or self.max_num_batched_tokens >= 1,
            "max_num_batched_tokens",
            f"must be >= 1, got {self.max_num_batched_tokens}",
        )
        _check(
            self.max_waiting_requests >= 1,
            "max_waiting_requests",
            f"must be >= 1, got {self.max_waiting_requests}",
        )
        _check(
            0.0 <= self.admission_reserve < 1.0,
            "admission_reserve",
            f"must be in [0, 1), got {self.admission_reserve}",
        )
        _check(
            self.prefill_chunk_size >= 1,
            "prefill_chunk_size",
            f"must be >= 1, got {self.prefill_chunk_size}",
        )
        _check(
            self.long_prefill_threshold >= 0,
            "long_prefill_threshold",
            f"must be >= 0, got {self.long_prefill_threshold}",
        )
        _check(
            self.max_prefill_chunks_per_step is None or self.max_prefill_chunks_per_step >= 1,
            "max_prefill_chunks_per_step",
            f"must be >= 1 or None, got {self.max_prefill_chunks_per_step}",
        )
        _check(
            self.max_graph_tokens >= 0,
            "max_graph_tokens",
            f"must be >= 0, got {self.max_graph_tokens}",
        )
        _check(
            self.quantization in (None, "fp8"),
            "quantization",
            f"must be None or 'fp8', got {self.quantization!r}",
        )
        _check(
            self.kv_cache_dtype in ("auto", "fp8"),
            "kv_cache_dtype",
            f"must be 'auto' or 'fp8', got {self.kv_cache_dtype!r}",
        )
        _check(
            self.dtype is None or self.dtype in _DTYPES,
            "dtype",
            f"must be one of {sorted(_DTYPES)}, got {self.dtype!r}",
        )
        _check(
            self.device is None or _DEVICE.fullmatch(self.device) is not None,
            "device",
            f"must be 'cpu' or 'cuda[:N]', got {self.device!r}",
        )
        _check(
            self.tensor_parallel_size >= 1,
            "tensor_parallel_size",
            f"must be >= 1, got {self.tensor_parallel_size}",
        )
        self._validate_nodes()
        static = self.batching_mode == "static"
        _check(
            not (static and self.kv_cache_backend == "paged"),
            "kv_cache_backend",
            "'paged' contradicts batching_mode='static' (static batching uses the contiguous "
            "cache; leave kv_cache_backend unset or choose batching_mode='continuous')",
        )
        _check(
            not (static and self.use_chunked_prefill),
            "use_chunked_prefill",
            "chunked prefill contradicts batching_mode='static' (it needs "
            "batching_mode='continuous')",
        )
        _check(
            not (self.use_prefix_caching and self.kv_cache_backend != "paged"),
            "use_prefix_caching",
            f"prefix caching contradicts kv_cache_backend={self.kv_cache_backend!r}"
            + (" (with batching_mode='static')" if static else "")
            + "; it needs kv_cache_backend='paged'",
        )
        if self.use_cuda_graphs:
            _check(
                self.kv_cache_backend == "paged" and not static,
                "use_cuda_graphs",
                f"CUDA graphs contradict kv_cache_backend={self.kv_cache_backend!r} / "
                f"batching_mode={self.batching_mode!r} (they need 'paged' and 'continuous')",
            )
            _check(
                self.resolved_device.type == "cuda",
                "use_cuda_graphs",
                f"CUDA graphs need a CUDA device, got {self.resolved_device}",
            )
        if self.device is not None and self.device.startswith("cuda"):
            _check(_cuda_available(), "device", "CUDA was requested but is not available")
        if self.tensor_parallel_size > 1 and self.resolved_device.type == "cuda":
            _check(
                self.resolved_device.index in (None, 0),
                "tensor_parallel_size",
                "ranks use cuda:0, cuda:1, ...; leave device as 'cuda'",
            )

    def _validate_nodes(self) -> None:
        _check(self.nnodes >= 1, "nnodes", f"must be >= 1, got {self.nnodes}")
        _check(
            self.tensor_parallel_size % self.nnodes == 0,
            "nnodes",
            f"{self.nnodes} nodes cannot share tensor_parallel_size {self.tensor_parallel_size} "
            "evenly (each node runs tensor_parallel_size / nnodes ranks)",
        )
        _check(
            0 <= self.node_rank < self.nnodes,
            "node_rank",
            f"must be in [0, nnodes - 1] = [0, {self.nnodes - 1}], got {self.node_rank}",
        )
        _check(
            self.master_port is None or 0 < self.master_port < 65536,
            "master_port",
            f"must be in [1, 65535], got {self.master_port}",
        )
        _check(
            self.dist_timeout > 0, "dist_timeout", f"must be > 0 seconds, got {self.dist_timeout}"
        )

    # Resolved values (the machine's choices for the ``None`` fields).
    @property
    def resolved_device(self) -> torch.device:
        import torch

        if self.device is not None:
            return torch.device(self.device)
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        if self.dtype is not None:
            dtype: torch.dtype = getattr(torch, self.dtype)
            return dtype
        return torch.bfloat16 if self.resolved_device.type == "cuda" else torch.float32

    def kv_cache_torch_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        import torch

        return torch.float8_e4m3fn if self.kv_cache_dtype == "fp8" else model_dtype

    @property
    def cuda_graphs_enabled(self) -> bool:
        if self.use_cuda_graphs is None:
            return (
                self.resolved_device.type == "cuda"
                and self.kv_cache_backend == "paged"
                and self.batching_mode == "continuous"
            )
        return self.use_cuda_graphs

    @property
    def warm_up_enabled(self) -> bool:
        if self.use_warm_up is None:
            return self.resolved_device.type == "cuda"
        return self.use_warm_up

    def resolved_max_seq_len(self, model: ModelConfig) -> int:
        """The context asked for: ``max_seq_len``, else the model's whole context (the KV
        cache's builder lowers the latter where the cache holds less)."""
        if self.max_seq_len is None:
            return model.max_position_embeddings
        _check(
            self.max_seq_len <= model.max_position_embeddings,
            "max_seq_len",
            f"{self.max_seq_len} exceeds the model's context "
            f"({model.max_position_embeddings} tokens)",
        )
        return self.max_seq_len

    def resolved_max_num_batched_tokens(self, max_seq_len: int) -> int:
        """Per-step token budget; without chunking a whole prompt must fit in one step."""
        budget = self.max_num_batched_tokens or DEFAULT_STEP_TOKENS
        if not self.use_chunked_prefill:
            budget = max(budget, max_seq_len)
        return max(budget, self.max_batch_size if self.batching_mode == "continuous" else 1)

    def resolved_long_prefill_step_tokens(self, max_seq_len: int) -> int:
        """The budget of a step that carries a long prompt's chunk (a sequence longer than
        ``long_prefill_threshold``): ``LONG_PREFILL_STEP_TOKENS`` unless
        ``max_num_batched_tokens`` was given (then that, for every step)."""
        budget = self.resolved_max_num_batched_tokens(max_seq_len)
        fixed = self.max_num_batched_tokens is not None or self.long_prefill_threshold == 0
        if fixed or not self.use_chunked_prefill:
            return budget
        return max(budget, LONG_PREFILL_STEP_TOKENS)

    def blocks_per_contiguous_slot(self, max_seq_len: int) -> int:
        return math.ceil(max_seq_len / self.block_size)


def _check(ok: bool, flag: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{flag}: {message}")


def _cuda_available() -> bool:
    # torch is imported where a config is checked, not where ``infer`` is: a client that
    # only builds requests never loads it.
    import torch

    return torch.cuda.is_available()
