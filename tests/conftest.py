"""Shared test setup and fixtures: the embedded SmolLM2 engine and tiny random checkpoints."""

from __future__ import annotations

import gc
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

# Triton kernels run under the interpreter on CPU-only machines (must be set before import).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _fix_interpreter_fp8_rounding() -> None:
    """The interpreter's narrowing casts into float8 e4m3 lose the carry of a round-up into
    the exponent (31.7 becomes 16, not 32); a GPU rounds to nearest. Tests of kernels that
    write FP8 get torch's cast, which is the GPU's."""
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    original = interpreter._convert_float
    sources = {tl.float32: torch.float32, tl.float16: torch.float16, tl.bfloat16: torch.bfloat16}

    def convert(values: Any, src: Any, dst: Any, rounding_mode: Any) -> Any:
        if dst != tl.float8e4nv or src not in sources:
            return original(values, src, dst, rounding_mode)
        bits = np.frombuffer(values.tobytes(), dtype=getattr(np, f"uint{src.primitive_bitwidth}"))
        wide = torch.from_numpy(bits.copy()).view(sources[src])
        return wide.to(torch.float8_e4m3fn).view(torch.uint8).numpy().reshape(values.shape)

    interpreter._convert_float = convert


if os.environ.get("TRITON_INTERPRET") == "1":
    _fix_interpreter_fp8_rounding()
# Under pytest-xdist the workers (with the servers they start) already fill the cores: one
# torch thread each, as more only spin against each other.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 320,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 512,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "qwen3": {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "vocab_size": 320,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 512,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "gemma3": {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "vocab_size": 320,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "sliding_window": 8,
        "sliding_window_pattern": 2,
        "query_pre_attn_scalar": 24,
        "max_position_embeddings": 512,
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": True,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
    },
}
# Qwen3 with YaRN scaling past a short pretrained context (for the long-context tests).
TINY_CONFIGS["qwen3_yarn"] = {
    **TINY_CONFIGS["qwen3"],
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
    },
}
FAMILIES = ("llama", "qwen3", "gemma3")
# A ``device`` parameter that runs on a CUDA GPU only (marked ``gpu``, skipped without one).
CUDA_PARAM = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    ],
)
# Texts that tokenizers get wrong most often: accents, CJK, emoji sequences, whitespace runs.
MIXED_SCRIPT_TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "Héllo wörld, naïve café, Ünïcödé: ñ ß ø å é.",
    "日本語のテキストと中文，还有한국어.",
    "emoji 🎉👍🏽 family 👨‍👩‍👧 flag 🇫🇷 🙂",
    "tabs\tand\n\nnewlines   spaces\n",
]


def chi_square_critical(df: int) -> float:
    """The 99.9th percentile of chi-square with ``df`` degrees (Wilson-Hilferty)."""
    z = 3.09
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def hf_config(family: str) -> Any:
    """The transformers config object of a tiny family config."""
    from transformers import AutoConfig

    raw = dict(TINY_CONFIGS[family])
    return AutoConfig.for_model(raw.pop("model_type"), **raw)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``tiny_checkpoint(family)`` → a saved HF checkpoint (random weights, no tokenizer)."""
    made: dict[str, Path] = {}

    def make(family: str) -> Path:
        if family not in made:
            from transformers import AutoModelForCausalLM

            torch.manual_seed(1234)
            model = AutoModelForCausalLM.from_config(hf_config(family), dtype=torch.float32)
            # Random norm weights too, so a wrong norm formula cannot hide behind ones.
            with torch.no_grad():
                for name, param in model.named_parameters():
                    if "norm" in name:
                        param.normal_(0.0, 0.1 if family == "gemma3" else 1.0)
            directory = tmp_path_factory.mktemp(f"tiny-{family}")
            model.save_pretrained(directory)
            made[family] = directory
        return made[family]

    return make


SMOLLM2_OPTIONS: dict[str, Any] = {"num_gpu_blocks": 512, "max_seq_len": 2048, "max_batch_size": 32}


@pytest.fixture(scope="session")
def smollm2_config() -> Any:
    """The settings of ``smollm2_llm``, for servers of the same model (which build their own
    engine: a test needing only them builds no model in-process)."""
    from infer.config import EngineConfig

    return EngineConfig(model="smollm2-135m", **SMOLLM2_OPTIONS)


@pytest.fixture(scope="session")
def smollm2_llm() -> Iterator[Any]:
    """The embedded SmolLM2-135M on the CPU, shared by every test that only reads from it."""
    from infer import LLM

    yield LLM("smollm2-135m", **SMOLLM2_OPTIONS)


@pytest.fixture(scope="session")
def smollm2_transformers() -> Any:
    """Hugging Face transformers' SmolLM2 read from the same GGUF file (float32, eval mode,
    no end of sequence: greedy runs to its length), the reference that tests only run."""
    from transformers import AutoModelForCausalLM

    from infer.loader.presets import embedded_model_path

    path = embedded_model_path()
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    model.generation_config.eos_token_id = None
    return model.eval()


@pytest.fixture
def unfrozen_heap() -> None:
    """A heap no one has frozen: tests that start the API app in this process leave it
    frozen (the app freezes its start-up heap), and freezing is what these tests check."""
    gc.unfreeze()


@pytest.fixture(autouse=True)
def gpu_memory_of_earlier_tests_freed(request: pytest.FixtureRequest) -> None:
    """Before a GPU test, the engines earlier tests left in reference cycles are collected
    and their cache blocks returned: otherwise a server started next finds the GPU full
    (a test file run after another's engine failed this way)."""
    if request.node.get_closest_marker("gpu") is not None and torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()
