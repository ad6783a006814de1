"""ModelConfig from config.json (both transformers spellings, presets, Gemma's wrapper and
layer types) and EngineConfig validation (each bad value names its flag)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from infer.config import (
    SUPPORTED_MODEL_TYPES,
    EngineConfig,
    ModelConfig,
    RopeConfig,
    cache_dir,
)
from infer.loader.presets import preset_config, preset_names

# Published HF config.json values (a copy of the team's shared/reference/model_configs.json).
REFERENCE = json.loads((Path(__file__).parent / "data/hf_model_configs.json").read_text())
PRESETS = json.loads((Path(__file__).parents[2] / "src/infer/loader/presets.json").read_text())
# gemma-3-4b-it's config.json as published (transformers 4.50): the text model lists only
# what differs from Gemma3TextConfig's defaults, and the generation's eos ids sit outside it.
GEMMA3_4B_WRAPPER: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "eos_token_id": [1, 106],
    "mm_tokens_per_image": 256,
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
}


def transformers_v5_dict(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` (4.x spelling) as transformers 5 writes it: ``rope_parameters``,
    ``layer_types``, ``dtype``."""
    from transformers import AutoConfig

    raw = dict(raw)
    out: dict[str, Any] = AutoConfig.for_model(raw.pop("model_type"), **raw).to_dict()
    assert "rope_parameters" in out and out.get("rope_scaling") is None
    return out


# --- presets and published configs ---------------------------------------------------------


@pytest.mark.parametrize("name", preset_names())
def test_preset_is_the_published_config(name: str) -> None:
    hub_id = PRESETS[name]["hub_id"]
    assert preset_config(name) == REFERENCE[hub_id]


def test_every_benchmark_model_has_a_preset() -> None:
    assert set(preset_names()) == {
        "llama-3.2-3b",
        "llama-3.2-1b",
        "llama-3.1-8b",
        "qwen3-4b",
        "qwen3-0.6b",
        "gemma-3-1b",
    }
    assert preset_config("no-such-preset") is None


@pytest.mark.parametrize("name", preset_names())
def test_preset_shapes(name: str) -> None:
    raw = REFERENCE[PRESETS[name]["hub_id"]]
    config = ModelConfig.from_hf_dict(preset_config(name) or {})
    assert config.model_type == raw["model_type"]
    assert (config.vocab_size, config.hidden_size, config.intermediate_size) == (
        raw["vocab_size"],
        raw["hidden_size"],
        raw["intermediate_size"],
    )
    assert (config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim) == (
        raw["num_hidden_layers"],
        raw["num_attention_heads"],
        raw["num_key_value_heads"],
        raw["head_dim"],
    )
    assert config.rms_norm_eps == raw["rms_norm_eps"]
    assert config.max_position_embeddings == raw["max_position_embeddings"]
    assert config.tie_word_embeddings == raw.get("tie_word_embeddings", True)
    eos = raw["eos_token_id"]
    assert config.eos_token_ids == tuple(eos if isinstance(eos, list) else [eos])
    assert config.kv_bytes_per_token(2) == (
        2 * raw["num_hidden_layers"] * raw["num_key_value_heads"] * raw["head_dim"] * 2
    )


def test_llama_3_2_rope_scaling() -> None:
    config = ModelConfig.from_hf_dict(REFERENCE["meta-llama/Llama-3.2-3B-Instruct"])
    assert config.rope == RopeConfig(
        theta=500000.0,
        rope_type="llama3",
        factor=32.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )
    assert config.local_rope is None and config.layer_types == ()


def test_qwen3_plain_rope() -> None:
    config = ModelConfig.from_hf_dict(REFERENCE["Qwen/Qwen3-4B"])
    assert config.rope == RopeConfig(theta=1_000_000.0)
    assert config.tie_word_embeddings and config.sliding_window is None


def test_gemma_3_1b_layers_from_sliding_window_pattern() -> None:
    config = ModelConfig.from_hf_dict(REFERENCE["google/gemma-3-1b-it"])
    full = [i for i, kind in enumerate(config.layer_types) if kind == "full_attention"]
    assert full == [5, 11, 17, 23]
    assert set(config.layer_types) == {"full_attention", "sliding_attention"}
    assert [config.window_of_layer(i) for i in (0, 4, 5, 6, 23, 25)] == [512, 512, 0, 512, 0, 512]
    assert config.rope == RopeConfig(theta=1_000_000.0)
    assert config.local_rope == RopeConfig(theta=10_000.0)
    assert config.query_pre_attn_scalar == 256
    assert config.hidden_act == "gelu_pytorch_tanh" and config.is_gemma


def test_gemma_explicit_layer_types_win() -> None:
    raw = dict(REFERENCE["google/gemma-3-1b-it"], num_hidden_layers=3)
    raw["layer_types"] = ["full_attention", "sliding_attention", "full_attention"]
    config = ModelConfig.from_hf_dict(raw)
    assert config.layer_types == tuple(raw["layer_types"])
    assert [config.window_of_layer(i) for i in range(3)] == [0, 512, 0]


@pytest.mark.parametrize(
    "hub_id", ["meta-llama/Llama-3.2-3B-Instruct", "Qwen/Qwen3-4B", "google/gemma-3-1b-it"]
)
def test_transformers_4_and_5_spellings_agree(hub_id: str) -> None:
    """``rope_theta``/``rope_scaling`` (4.x) and ``rope_parameters`` (5.x; per layer type for
    Gemma 3, with ``layer_types``) describe the same model."""
    v4 = REFERENCE[hub_id]
    v5 = transformers_v5_dict(v4)
    assert "rope_theta" not in v5 and "torch_dtype" not in v5
    if v4["model_type"] == "gemma3_text":
        assert set(v5["rope_parameters"]) == {"full_attention", "sliding_attention"}
        assert len(v5["layer_types"]) == v4["num_hidden_layers"]
    assert ModelConfig.from_hf_dict(v5) == ModelConfig.from_hf_dict(v4)


def test_rope_parameters_with_scaling() -> None:
    """5.x keeps a scaled RoPE's type and factors beside its theta (Gemma 3 4B: linear on
    the global layers only)."""
    llama = {
        k: v
        for k, v in REFERENCE["meta-llama/Llama-3.1-8B-Instruct"].items()
        if k not in ("rope_theta", "rope_scaling")
    }
    llama["rope_parameters"] = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert ModelConfig.from_hf_dict(llama).rope == RopeConfig(
        theta=500000.0, rope_type="llama3", factor=8.0, original_max_position_embeddings=8192
    )
    gemma = dict(REFERENCE["google/gemma-3-1b-it"])
    gemma["rope_parameters"] = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    }
    config = ModelConfig.from_hf_dict(gemma)
    assert config.rope == RopeConfig(theta=1_000_000.0, rope_type="linear", factor=8.0)
    assert config.local_rope == RopeConfig(theta=10_000.0)


# --- Gemma 3's multimodal wrapper ----------------------------------------------------------


def test_gemma3_wrapper_uses_text_config_and_defaults() -> None:
    config = ModelConfig.from_hf_dict(GEMMA3_4B_WRAPPER)
    assert config.model_type == "gemma3_text"
    assert (config.hidden_size, config.intermediate_size, config.num_layers) == (2560, 10240, 34)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (8, 4, 256)
    assert config.vocab_size == 262_208 and config.tie_word_embeddings
    assert config.sliding_window == 1024 and config.query_pre_attn_scalar == 256
    assert config.rope == RopeConfig(theta=1_000_000.0, rope_type="linear", factor=8.0)
    assert config.local_rope == RopeConfig(theta=10_000.0)
    assert config.eos_token_ids == (1, 106) and config.bos_token_id == 2
    assert [i for i, t in enumerate(config.layer_types) if t == "full_attention"] == [
        5,
        11,
        17,
        23,
        29,
    ]


def test_gemma3_wrapper_defaults_match_transformers() -> None:
    """Our Gemma3TextConfig defaults are transformers' own: its fully expanded text config
    parses to the same model (except eos, which transformers keeps on the wrapper)."""
    from transformers import Gemma3Config

    expanded = Gemma3Config(**GEMMA3_4B_WRAPPER).text_config.to_dict()
    ours = ModelConfig.from_hf_dict(GEMMA3_4B_WRAPPER)
    theirs = ModelConfig.from_hf_dict(expanded)
    assert dataclasses.replace(ours, eos_token_ids=theirs.eos_token_ids) == theirs


def test_gemma3_wrapper_as_transformers_5_saves_it() -> None:
    from transformers import Gemma3Config

    saved = Gemma3Config(**GEMMA3_4B_WRAPPER).to_dict()
    assert saved["model_type"] == "gemma3" and "text_config" in saved
    assert ModelConfig.from_hf_dict(saved) == ModelConfig.from_hf_dict(GEMMA3_4B_WRAPPER)


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("model_type", ["mistral", None])
def test_unknown_model_type_names_the_supported_ones(model_type: str | None) -> None:
    raw = dict(REFERENCE["meta-llama/Llama-3.2-1B-Instruct"], model_type=model_type)
    with pytest.raises(ValueError, match="model_type") as info:
        ModelConfig.from_hf_dict(raw)
    assert repr(model_type) in str(info.value)
    assert all(name in str(info.value) for name in SUPPORTED_MODEL_TYPES)


def test_unsupported_rope_type_is_named() -> None:
    raw = dict(REFERENCE["meta-llama/Llama-3.2-1B-Instruct"])
    raw["rope_scaling"] = {"rope_type": "longrope", "factor": 4.0}
    with pytest.raises(ValueError, match=r"^rope_scaling: type 'longrope' is not supported"):
        ModelConfig.from_hf_dict(raw)


def test_yarn_reads_its_defaults_as_transformers_does() -> None:
    raw = dict(REFERENCE["Qwen/Qwen3-4B"])
    raw["rope_scaling"] = {"rope_type": "yarn", "original_max_position_embeddings": 32768}
    rope = ModelConfig.from_hf_dict(raw).rope
    assert rope.rope_type == "yarn" and rope.factor == 40960 / 32768
    assert rope.attention_factor == pytest.approx(0.1 * math.log(40960 / 32768) + 1)
    raw["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "mscale": 2, "mscale_all_dim": 1}
    rope = ModelConfig.from_hf_dict(raw).rope
    expected = (0.2 * math.log(4.0) + 1) / (0.1 * math.log(4.0) + 1)
    assert rope.original_max_position_embeddings == 40960
    assert rope.attention_factor == pytest.approx(expected)


def test_qwen3_sliding_window_is_rejected() -> None:
    raw = dict(REFERENCE["Qwen/Qwen3-4B"], use_sliding_window=True, sliding_window=4096)
    with pytest.raises(ValueError, match="use_sliding_window"):
        ModelConfig.from_hf_dict(raw)


# --- EngineConfig ---------------------------------------------------------------------------

STATIC = {
    "batching_mode": "static",
    "kv_cache_backend": "contiguous",
    "use_chunked_prefill": False,
    "use_prefix_caching": False,
}
CONTIGUOUS = {"kv_cache_backend": "contiguous", "use_prefix_caching": False}
INVALID: list[tuple[dict[str, Any], str]] = [
    ({"batching_mode": "dynamic"}, "batching_mode"),
    ({"kv_cache_backend": "blocks"}, "kv_cache_backend"),
    ({"load_format": "pickle"}, "load_format"),
    ({"block_size": 0}, "block_size"),
    ({"num_gpu_blocks": 0}, "num_gpu_blocks"),
    ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"max_batch_size": 0}, "max_batch_size"),
    ({"max_seq_len": 1}, "max_seq_len"),
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
    ({"max_waiting_requests": 0}, "max_waiting_requests"),
    ({"admission_reserve": 1.0}, "admission_reserve"),
    ({"prefill_chunk_size": 0}, "prefill_chunk_size"),
    ({"max_prefill_chunks_per_step": 0}, "max_prefill_chunks_per_step"),
    ({"quantization": "int8"}, "quantization"),
    ({"kv_cache_dtype": "fp16"}, "kv_cache_dtype"),
    ({"dtype": "float64"}, "dtype"),
    ({"device": "tpu"}, "device"),
    ({"device": "cudafoo"}, "device"),
    ({"nnodes": 0}, "nnodes"),
    ({"master_port": 70000}, "master_port"),
    ({"dist_timeout": 0}, "dist_timeout"),
    # Combinations.
    ({"tensor_parallel_size": 4, "nnodes": 3}, "nnodes"),  # 4 ranks do not split over 3
    ({"tensor_parallel_size": 2, "nnodes": 2, "node_rank": 2}, "node_rank"),
    ({"tensor_parallel_size": 2, "nnodes": 2, "node_rank": -1}, "node_rank"),
    ({**STATIC, "kv_cache_backend": "paged"}, "kv_cache_backend"),
    ({**STATIC, "use_chunked_prefill": True}, "use_chunked_prefill"),
    ({"kv_cache_backend": "contiguous", "use_prefix_caching": True}, "use_prefix_caching"),
    ({**CONTIGUOUS, "use_cuda_graphs": True}, "use_cuda_graphs"),
    ({**STATIC, "use_cuda_graphs": True}, "use_cuda_graphs"),
    ({"device": "cpu", "use_cuda_graphs": True}, "use_cuda_graphs"),
]


@pytest.mark.parametrize(("options", "flag"), INVALID, ids=[f for _, f in INVALID])
def test_invalid_engine_config_names_the_flag(options: dict[str, Any], flag: str) -> None:
    with pytest.raises(ValueError, match=rf"^{flag}: "):
        EngineConfig(**options)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize(
    ("options", "flag"),
    [({"use_cuda_graphs": True}, "use_cuda_graphs"), ({"device": "cuda"}, "device")],
)
def test_cuda_without_cuda_names_the_flag(options: dict[str, Any], flag: str) -> None:
    """The default device resolves to the CPU here, so CUDA graphs must be refused too."""
    with pytest.raises(ValueError, match=rf"^{flag}: "):
        EngineConfig(**options)


@pytest.mark.parametrize(
    "options",
    [
        {},
        STATIC,
        CONTIGUOUS,
        {**CONTIGUOUS, "use_chunked_prefill": False},
        {"use_prefix_caching": False, "use_chunked_prefill": False, "use_cuda_graphs": False},
        {"device": "cpu", "dtype": "bfloat16", "num_gpu_blocks": 1, "max_seq_len": 2},
        {"max_prefill_chunks_per_step": 1, "admission_reserve": 0.0},
    ],
)
def test_valid_engine_configs(options: dict[str, Any]) -> None:
    config = EngineConfig(**options)
    assert {k: getattr(config, k) for k in options} == options


def test_validate_rechecks_after_changes() -> None:
    config = EngineConfig()
    config.block_size = 0
    with pytest.raises(ValueError, match=r"^block_size: "):
        config.validate()


def test_cpu_resolution_and_max_seq_len_bound() -> None:
    config = EngineConfig(device="cpu")
    assert config.torch_dtype == torch.float32 and not config.cuda_graphs_enabled
    model = ModelConfig.from_hf_dict(REFERENCE["Qwen/Qwen3-0.6B"])
    assert config.resolved_max_seq_len(model) == model.max_position_embeddings == 40960
    too_long = EngineConfig(device="cpu", max_seq_len=model.max_position_embeddings + 1)
    with pytest.raises(ValueError, match=r"^max_seq_len: "):
        too_long.resolved_max_seq_len(model)


# --- Defaults that follow other choices -----------------------------------------------------

ADAPTED: list[tuple[dict[str, Any], tuple[str, bool, bool]]] = [
    ({}, ("paged", True, True)),
    ({"kv_cache_backend": "contiguous"}, ("contiguous", True, False)),
    ({"batching_mode": "static"}, ("contiguous", False, False)),
    ({"use_prefix_caching": False}, ("paged", True, False)),
    ({"batching_mode": "static", "kv_cache_backend": "contiguous"}, ("contiguous", False, False)),
    ({"kv_cache_backend": "paged", "use_chunked_prefill": False}, ("paged", False, True)),
]


@pytest.mark.parametrize(("options", "resolved"), ADAPTED, ids=[str(o) for o, _ in ADAPTED])
def test_fields_left_unset_follow_the_choices_made(
    options: dict[str, Any], resolved: tuple[str, bool, bool]
) -> None:
    """The seeds' one-flag commands (``--kv-cache-backend contiguous``, ``--batching-mode
    static``) are valid: what the user left unset adapts instead of contradicting them."""
    config = EngineConfig(**options)
    assert (config.kv_cache_backend, config.use_chunked_prefill, config.use_prefix_caching) == (
        resolved
    )


@pytest.mark.parametrize(
    ("options", "reason", "adapted"),
    [
        (
            {"batching_mode": "static"},
            "batching_mode='static'",
            "kv_cache_backend='contiguous', use_chunked_prefill=False, use_prefix_caching=False",
        ),
        (
            {"kv_cache_backend": "contiguous"},
            "kv_cache_backend='contiguous'",
            "use_prefix_caching=False",
        ),
    ],
)
def test_adapted_defaults_are_logged_once(
    options: dict[str, Any], reason: str, adapted: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="infer.config"):
        EngineConfig(**options)
    assert [r.getMessage() for r in caplog.records] == [f"{reason}: defaulting to {adapted}"]


def test_usual_defaults_log_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="infer.config"):
        EngineConfig()
        EngineConfig(kv_cache_backend="paged", use_prefix_caching=False)
    assert caplog.records == []


CONTRADICTIONS: list[tuple[dict[str, Any], str, str]] = [
    ({"batching_mode": "static", "kv_cache_backend": "paged"}, "kv_cache_backend", "batching_mode"),
    (
        {"batching_mode": "static", "use_chunked_prefill": True},
        "use_chunked_prefill",
        "batching_mode",
    ),
    (
        {"batching_mode": "static", "use_prefix_caching": True},
        "use_prefix_caching",
        "batching_mode",
    ),
    (
        {"kv_cache_backend": "contiguous", "use_prefix_caching": True},
        "use_prefix_caching",
        "kv_cache_backend",
    ),
    (
        {"kv_cache_backend": "contiguous", "use_cuda_graphs": True},
        "use_cuda_graphs",
        "kv_cache_backend",
    ),
    ({"batching_mode": "static", "use_cuda_graphs": True}, "use_cuda_graphs", "batching_mode"),
]


@pytest.mark.parametrize(
    ("options", "flag", "other"), CONTRADICTIONS, ids=[str(o) for o, _, _ in CONTRADICTIONS]
)
def test_explicit_contradictions_name_both_flags(
    options: dict[str, Any], flag: str, other: str
) -> None:
    with pytest.raises(ValueError, match=rf"^{flag}: .*{other}="):
        EngineConfig(**options)


def test_cache_dir_is_infer_cache_dir_or_home_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("INFER_CACHE_DIR", raising=False)
    assert cache_dir() == Path.home() / ".cache" / "infer"
    monkeypatch.setenv("INFER_CACHE_DIR", str(tmp_path))
    assert cache_dir() == tmp_path


def test_the_warm_up_is_on_with_cuda_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not EngineConfig(device="cpu").warm_up_enabled
    assert EngineConfig(device="cpu", use_warm_up=True).warm_up_enabled
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert EngineConfig(device="cuda").warm_up_enabled
    assert not EngineConfig(device="cuda", use_warm_up=False).warm_up_enabled


def test_a_long_prompts_step_budget_is_16384_unless_the_budget_was_given() -> None:
    config = EngineConfig(device="cpu")
    assert config.resolved_max_num_batched_tokens(131072) == 8192
    assert config.resolved_long_prefill_step_tokens(131072) == 16384
    given = EngineConfig(device="cpu", max_num_batched_tokens=4096)
    assert given.resolved_long_prefill_step_tokens(131072) == 4096
    fixed = EngineConfig(device="cpu", long_prefill_threshold=0)  # the fixed-chunk policy
    assert fixed.resolved_long_prefill_step_tokens(131072) == 8192
    whole = EngineConfig(device="cpu", use_chunked_prefill=False)  # a whole prompt a step
    assert whole.resolved_long_prefill_step_tokens(4096) == 8192
    with pytest.raises(ValueError, match=r"^long_prefill_threshold: must be >= 0"):
        EngineConfig(device="cpu", long_prefill_threshold=-1)
