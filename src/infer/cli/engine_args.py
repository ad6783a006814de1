"""Command-line flags for every ``EngineConfig`` field, derived from the dataclass.

``use_x`` fields become ``--x/--no-x`` (``--chunked-prefill``, ``--prefix-caching``,
``--cuda-graphs``); the rest become ``--kebab-case`` flags with the field's type. A flag
that is not given stays at the field's default, so the fields that follow other choices
(``None``) adapt to the flags that were given.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from typing import Any

from infer.config import EngineConfig

_HELP = {
    "model": "built-in name (smollm2-135m, llama-3.2-3b, ...), .gguf file, HF directory or Hub id",
    "load_format": "auto | dummy (random weights at the model's shapes) | safetensors | gguf",
    "batching_mode": "static | continuous",
    "kv_cache_backend": "contiguous | paged (default: paged; contiguous with static batching)",
    "use_chunked_prefill": "split long prompts over steps (default: on; off with static batching)",
    "use_prefix_caching": "reuse cached prompt prefixes (default: on with the paged cache)",
    "num_gpu_blocks": "KV cache blocks (default: sized from free memory)",
    "max_seq_len": "prompt + output (default: the model's context, or what the KV cache holds)",
    "use_cuda_graphs": "replay steps from captured CUDA graphs (default: on with CUDA)",
    "long_prefill_threshold": "prompts take chunks as large as the step's token budget when "
    "nothing decodes, or beside decoding requests when longer than this; others take "
    "--prefill-chunk-size (0: every chunk that size)",
    "max_graph_tokens": "largest step with prompt tokens that replays a graph (0: decode only)",
    "use_warm_up": "before saying it is ready, run once the steps first traffic runs (every "
    "sampling kind, prompt lengths, batch sizes), so none compiles then (default: on with CUDA)",
    "use_sdpa_prefill": "long prompt chunks through torch's fused attention (cuDNN) instead of "
    "the Triton kernel, in steps that run eagerly on a GPU (default: on)",
    "use_launch_pacing": "with async scheduling, queue the next step just before the one in "
    "flight ends, so requests arriving meanwhile join it (default: on)",
    "quantization": "fp8: FP8 weights with per-channel scales, activations per token "
    "(default: none; FP8 checkpoints load as they are)",
    "kv_cache_dtype": "auto (the model's dtype) | fp8 (e4m3, half the bytes: twice the tokens)",
    "dtype": "float32 | float16 | bfloat16 (default: bfloat16 on CUDA, float32 on CPU)",
    "device": "cpu | cuda[:N] (default: cuda when available)",
    "tensor_parallel_size": "split the model over this many ranks (GPUs, or CPU processes)",
    "nnodes": "nodes the tensor-parallel ranks are spread over, tensor_parallel_size / nnodes "
    "on each; every node runs the same command ($GROUP_WORLD_SIZE under torchrun)",
    "node_rank": "this node, 0 to nnodes - 1: node 0 serves the API, the others run their "
    "ranks headless ($NODE_RANK, or $GROUP_RANK under torchrun)",
    "master_addr": "node 0's address, where the other nodes meet it ($MASTER_ADDR)",
    "master_port": "node 0's rendezvous port ($MASTER_PORT; default: a free port on one node, "
    "29500 across nodes)",
    "dist_timeout": "seconds a node waits to reach node 0, and node 0 for the others' ranks",
    "speculative_config": 'JSON, as vLLM: {"method": "ngram", "num_speculative_tokens": 4, '
    '"prompt_lookup_max": 4} (default: no speculation)',
}
# Fields given as JSON text, which ``EngineConfig`` parses (its errors name the setting).
_JSON_FIELDS = frozenset({"speculative_config"})
_ALIASES = {"tensor_parallel_size": ["-tp"]}
# The environment a launcher sets (torchrun's, and NODE_RANK of others) gives the defaults.
_ENV_DEFAULTS = {
    "nnodes": ("GROUP_WORLD_SIZE",),
    "node_rank": ("NODE_RANK", "GROUP_RANK"),
    "master_addr": ("MASTER_ADDR",),
    "master_port": ("MASTER_PORT",),
}


def _flag(name: str) -> str:
    return "--" + name.removeprefix("use_").replace("_", "-")


def _base_type(annotation: Any) -> type:
    hints = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else ()
    candidates = [h for h in hints if h is not type(None)] or [annotation]
    base = candidates[0]
    if typing.get_origin(base) is typing.Literal:
        return str
    return base if isinstance(base, type) else str


def add_engine_args(parser: argparse.ArgumentParser, exclude: frozenset[str] = frozenset()) -> None:
    """Add the engine flags (``exclude`` names fields a command uses for its own flag)."""
    hints = typing.get_type_hints(EngineConfig)
    group = parser.add_argument_group("engine options")
    for field in dataclasses.fields(EngineConfig):
        if field.name in exclude:
            continue
        base = str if field.name in _JSON_FIELDS else _base_type(hints[field.name])
        default = _env_default(field.name, field.default)
        # A ``None`` default is explained by the help text (it depends on the machine or
        # on other flags).
        shown = "" if default is None else f" (default: {default})"
        kwargs: dict[str, Any] = {
            "dest": field.name,
            "default": default,
            "help": _HELP.get(field.name, "") + shown,
        }
        if base is bool:
            group.add_argument(_flag(field.name), action=argparse.BooleanOptionalAction, **kwargs)
        else:
            flags = [_flag(field.name), *_ALIASES.get(field.name, [])]
            group.add_argument(*flags, type=base, **kwargs)


def _env_default(name: str, default: Any) -> Any:
    """The launcher's value (a string, which argparse converts and checks like a flag's)."""
    for variable in _ENV_DEFAULTS.get(name, ()):
        if os.environ.get(variable):
            return os.environ[variable]
    return default


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """Build and validate the config (``ValueError`` names the offending flag)."""
    values = {
        name: getattr(args, name)
        for name in EngineConfig.field_names()
        if name in vars(args) and not name.startswith("_")
    }
    return EngineConfig(**values)
