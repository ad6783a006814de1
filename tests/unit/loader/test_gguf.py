"""GGUF files: configuration from llama.cpp's metadata keys, every tensor type gguf knows
dequantised, llama.cpp's layout changes undone (checked against the original weights and
against transformers' own GGUF loader), and an error naming the tensor for each bad file."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf.quants import dequantize

from infer import LLM, SamplingParams
from infer.config import ModelConfig, RopeConfig
from infer.loader import load_model, resolve_model
from infer.loader.presets import embedded_model_path
from infer.models import DecoderModel

from .conftest import QUANT_TYPES, TinyGGUF
from .helpers import (
    assert_model_equals,
    gguf_names,
    hf_view,
    llama_cpp_permute,
    random_blocks,
    to_llama_cpp,
)
from .helpers import write_gguf as write

FAMILIES = ("llama", "qwen3", "gemma3")
CPU = torch.device("cpu")
# Largest error of a type relative to the tensor's largest magnitude (quantisation noise;
# F32 only rounds Gemma's 1 + w).
TOLERANCE = {
    "F32": 1e-6,
    "F16": 1e-3,
    "BF16": 1e-2,
    "Q8_0": 1e-2,
    "Q5_0": 0.05,
    "Q5_1": 0.05,
    "Q4_0": 0.1,
    "Q4_1": 0.1,
}


def load(path: Path) -> DecoderModel:
    model, _ = load_model(resolve_model(str(path)), CPU, torch.float32, max_positions=64)
    return model


@pytest.fixture(scope="module")
def loaded(tiny_gguf: Callable[[str], TinyGGUF]) -> Callable[[str], DecoderModel]:
    models: dict[str, DecoderModel] = {}

    def get(family: str) -> DecoderModel:
        if family not in models:
            models[family] = load(tiny_gguf(family).path)
        return models[family]

    return get


def stored_types(path: Path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}


def gguf_dequantises(qtype: Q) -> bool:
    try:
        dequantize(random_blocks(1, 256, qtype), qtype)
    except NotImplementedError:
        return False
    return True


@pytest.mark.parametrize("qtype", list(Q), ids=lambda qtype: qtype.name)
def test_every_type_gguf_dequantises_loads(
    qtype: Q, tiny_gguf: Callable[[str], TinyGGUF], tmp_path: Path
) -> None:
    """One weight stored as ``qtype``: it loads as gguf's own dequantisation of the stored
    bytes, and a type gguf cannot dequantise is named in the error."""
    config, tensors = llama_tensors(tiny_gguf)
    path = write(tmp_path / "one-type.gguf", config, tensors, {"blk.0.ffn_down.weight": qtype})
    (stored,) = [t for t in GGUFReader(path).tensors if t.name == "blk.0.ffn_down.weight"]
    assert stored.tensor_type == qtype
    if not gguf_dequantises(qtype):
        with pytest.raises(
            ValueError, match=rf"^tensor blk\.0\.ffn_down\.weight: GGUF type {qtype.name} "
        ):
            load(path)
        return
    ours = hf_view(load(path), "model.layers.0.mlp.down_proj.weight").numpy()
    expected = dequantize(stored.data, stored.tensor_type)
    assert np.isfinite(expected).all() and np.abs(expected).max() > 0
    np.testing.assert_array_equal(ours, expected)


def test_the_popular_types_are_dequantised() -> None:
    """The types of popular files (Q4_K_M's mix, the low-bit K-quants, the IQ family)."""
    popular = ("Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q6_K", "IQ2_XS", "IQ4_XS")
    assert all(gguf_dequantises(Q[name]) for name in popular)


@pytest.mark.parametrize("family", FAMILIES)
def test_weights_are_the_dequantised_data(
    family: str, tiny_gguf: Callable[[str], TinyGGUF], loaded: Callable[[str], DecoderModel]
) -> None:
    """Each weight is gguf's dequantisation of the stored bytes once llama.cpp's changes are
    undone; re-applying them here (in llama.cpp's direction) must give the bytes' values."""
    tiny, model = tiny_gguf(family), loaded(family)
    config, to_gguf = tiny.config, gguf_names(tiny.config)
    stored = {t.name: t for t in GGUFReader(tiny.path).tensors}
    types_seen = set()
    for name in sorted(model.expected_weights()):
        tensor = stored[to_gguf(name)]
        types_seen.add(tensor.tensor_type.name)
        ours = hf_view(model, name).numpy()
        if config.model_type == "llama" and name.endswith("q_proj.weight"):
            ours = llama_cpp_permute(ours, config.num_heads)
        elif config.model_type == "llama" and name.endswith("k_proj.weight"):
            ours = llama_cpp_permute(ours, config.num_kv_heads)
        elif config.is_gemma and name.endswith("norm.weight"):
            ours = ours + 1.0
        expected = dequantize(tensor.data, tensor.tensor_type)
        np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-6, err_msg=name)
    assert types_seen == {q.name for q in QUANT_TYPES.values()} | {"F32"}


@pytest.mark.parametrize("family", FAMILIES)
def test_weights_round_trip_to_the_original_model(
    family: str, tiny_gguf: Callable[[str], TinyGGUF], loaded: Callable[[str], DecoderModel]
) -> None:
    """HF weights → llama.cpp conversion → our loader gives the HF weights back, up to the
    quantisation noise of each type (K-quant tensors hold random blocks, so are skipped)."""
    tiny, model = tiny_gguf(family), loaded(family)
    types, to_gguf = stored_types(tiny.path), gguf_names(tiny.config)
    original = tiny.hf_model.state_dict()
    checked = 0
    for name in sorted(model.expected_weights()):
        kind = types[to_gguf(name)]
        if kind not in TOLERANCE:
            continue
        want = original[name]
        atol = TOLERANCE[kind] * float(want.abs().max())
        torch.testing.assert_close(hf_view(model, name), want, rtol=0, atol=atol, msg=name)
        checked += 1
    assert checked == len(model.expected_weights()) - 3  # all but the three K-quant tensors


@pytest.mark.parametrize("family", FAMILIES)
def test_weights_match_transformers_gguf_loader(
    family: str, tiny_gguf: Callable[[str], TinyGGUF], loaded: Callable[[str], DecoderModel]
) -> None:
    """transformers reads the same file to the same weights: the rotary un-permutation and
    Gemma's ``w - 1`` agree with its conventions. (Its config reader needs a tokenizer for
    the vocabulary size, so it is given the model's config.)"""
    from transformers import AutoModelForCausalLM

    tiny = tiny_gguf(family)
    reference = AutoModelForCausalLM.from_pretrained(
        tiny.path.parent,
        gguf_file=tiny.path.name,
        config=tiny.hf_model.config,
        dtype=torch.float32,
    )
    assert_model_equals(loaded(family), reference.state_dict())


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_on_gguf_matches_transformers(
    family: str, tiny_gguf: Callable[[str], TinyGGUF]
) -> None:
    """A GGUF without a tokenizer runs from token ids, and its next-token log-probabilities
    (config from the metadata, weights from the file) are transformers' on the same file."""
    from transformers import AutoModelForCausalLM

    tiny = tiny_gguf(family)
    llm = LLM(str(tiny.path), device="cpu", num_gpu_blocks=32, max_seq_len=64, max_batch_size=4)
    assert llm.tokenizer is None
    with pytest.raises(ValueError, match=r"^prompt: "):
        llm.generate("text needs a tokenizer")
    prompt = torch.randint(
        3, tiny.config.vocab_size, (20,), generator=torch.Generator().manual_seed(0)
    )
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=20, ignore_eos=True)
    (result,) = llm.generate([prompt.tolist()], params, use_tqdm=False)
    top = result.outputs[0].logprobs[0].top
    reference = AutoModelForCausalLM.from_pretrained(
        tiny.path.parent,
        gguf_file=tiny.path.name,
        config=tiny.hf_model.config,
        dtype=torch.float32,
    )
    with torch.no_grad():
        expected = reference(prompt[None]).logits[0, -1].log_softmax(-1)
    assert len(top) == 20
    ids = torch.tensor(list(top))
    torch.testing.assert_close(torch.tensor(list(top.values())), expected[ids], atol=1e-4, rtol=0)
    assert result.outputs[0].token_ids == [int(expected.argmax())]


@pytest.mark.parametrize("family", FAMILIES)
def test_config_from_metadata(family: str, tiny_gguf: Callable[[str], TinyGGUF]) -> None:
    tiny = tiny_gguf(family)
    source = resolve_model(str(tiny.path))
    assert (source.kind, source.path, source.name) == ("gguf", tiny.path, tiny.path.name)
    config = ModelConfig.from_hf_dict(source.hf_config)
    assert config.rms_norm_eps == pytest.approx(tiny.config.rms_norm_eps)  # stored as float32
    assert replace(config, rms_norm_eps=tiny.config.rms_norm_eps, torch_dtype="float32") == (
        replace(tiny.config, torch_dtype="float32")
    )


def llama_tensors(
    tiny_gguf: Callable[[str], TinyGGUF],
) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    tiny = tiny_gguf("llama")
    return tiny.config, to_llama_cpp(tiny.config, tiny.hf_model.state_dict())


def llama_cpp_rope_freqs(theta: float, head_dim: int, factor: float) -> np.ndarray:
    """``convert_hf_to_gguf.py``'s ``rope_freqs`` table for Llama 3 scaling (band edges of
    every Llama 3.x: low 1, high 4, original context 8192)."""
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / freqs
    smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
    divisors = np.where(
        wavelen < 8192 / 4.0,
        1.0,
        np.where(wavelen > 8192, factor, 1 / ((1 - smooth) / factor + smooth)),
    )
    return divisors.astype(np.float32)


def test_llama3_rope_scaling_from_rope_freqs(
    tiny_gguf: Callable[[str], TinyGGUF], tmp_path: Path
) -> None:
    """llama.cpp writes no scaling keys for Llama 3, only the divisor table: Llama 3.2's
    factor 32 must come from it (not a default of 8)."""
    config, tensors = llama_tensors(tiny_gguf)
    config = replace(config, rope=RopeConfig(theta=500_000.0))
    tensors["rope_freqs.weight"] = llama_cpp_rope_freqs(500_000.0, config.head_dim, 32.0)
    path = write(tmp_path / "llama3.gguf", config, tensors)
    source = resolve_model(str(path))
    assert ModelConfig.from_hf_dict(source.hf_config).rope == RopeConfig(
        theta=500_000.0, rope_type="llama3", factor=32.0, original_max_position_embeddings=8192
    )
    assert source.gguf is not None and source.gguf.num_tensors() == len(tensors) - 1
    load(path)  # the table itself is not a weight


def test_gemma_linear_rope_scaling_and_end_of_turn(
    tiny_gguf: Callable[[str], TinyGGUF], tmp_path: Path
) -> None:
    tiny = tiny_gguf("gemma3")

    def extra(writer: gguf.GGUFWriter) -> None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(8.0)
        writer.add_eot_token_id(106)

    tensors = to_llama_cpp(tiny.config, tiny.hf_model.state_dict())
    path = write(tmp_path / "gemma.gguf", tiny.config, tensors, extra=extra)
    config = ModelConfig.from_hf_dict(resolve_model(str(path)).hf_config)
    assert config.rope == RopeConfig(theta=1_000_000.0, rope_type="linear", factor=8.0)
    assert config.local_rope == RopeConfig(theta=10_000.0)
    assert config.eos_token_ids == (1, 106)


def _drop(name: str) -> Callable[[dict[str, np.ndarray]], None]:
    def change(tensors: dict[str, np.ndarray]) -> None:
        del tensors[name]

    return change


def _set(name: str, shape: tuple[int, ...]) -> Callable[[dict[str, np.ndarray]], None]:
    def change(tensors: dict[str, np.ndarray]) -> None:
        tensors[name] = np.zeros(shape, dtype=np.float32)

    return change


BROKEN = {
    "missing tensor": (
        _drop("blk.1.ffn_up.weight"),
        {},
        r"^tensor model\.layers\.1\.mlp\.up_proj\.weight: missing",
    ),
    "wrong shape": (
        _set("blk.2.attn_v.weight", (16, 64)),
        {},
        r"^tensor model\.layers\.2\.self_attn\.v_proj\.weight: checkpoint shape \(16, 64\)",
    ),
    "unknown name": (
        _set("blk.0.attn_qkv.weight", (64, 64)),
        {},
        r"^tensor blk\.0\.attn_qkv\.weight: unknown GGUF tensor name",
    ),
    "layer beyond depth": (
        _set("blk.3.attn_norm.weight", (64,)),
        {},
        r"^tensor model\.layers\.3\.input_layernorm\.weight: not a weight",
    ),
    "type gguf cannot dequantise": (
        lambda tensors: None,
        {"blk.0.attn_q.weight": Q.Q8_1},
        r"^tensor blk\.0\.attn_q\.weight: GGUF type Q8_1 is not supported \(gguf [\d.]+ cannot",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_file_names_the_tensor(
    case: str, tiny_gguf: Callable[[str], TinyGGUF], tmp_path: Path
) -> None:
    change, types, message = BROKEN[case]
    config, tensors = llama_tensors(tiny_gguf)
    change(tensors)
    path = write(tmp_path / "broken.gguf", config, tensors, types)
    with pytest.raises(ValueError, match=message):
        load(path)


def test_file_without_embedding_is_refused(
    tiny_gguf: Callable[[str], TinyGGUF], tmp_path: Path
) -> None:
    config, tensors = llama_tensors(tiny_gguf)
    del tensors["token_embd.weight"]
    path = write(tmp_path / "no-embedding.gguf", config, tensors)
    with pytest.raises(ValueError, match=r"^tensor token_embd\.weight: missing"):
        resolve_model(str(path))


def test_unsupported_architecture_names_the_supported_ones(
    tiny_gguf: Callable[[str], TinyGGUF], tmp_path: Path
) -> None:
    config, tensors = llama_tensors(tiny_gguf)
    path = write(tmp_path / "phi.gguf", config, tensors, arch="phi3")
    with pytest.raises(ValueError, match=r"architecture 'phi3'.*llama, qwen3, gemma3"):
        resolve_model(str(path))


def test_embedded_smollm2_config(smollm2_llm: LLM) -> None:
    """The default model's shape, read from its GGUF metadata."""
    engine = smollm2_llm.engine
    assert engine.source.kind == "gguf" and engine.source.path == embedded_model_path()
    config = engine.model_config
    assert config.model_type == "llama" and config.tie_word_embeddings
    assert (config.hidden_size, config.num_layers, config.num_heads, config.num_kv_heads) == (
        576,
        30,
        9,
        3,
    )
    assert (config.head_dim, config.vocab_size) == (64, 49152)
    assert config.eos_token_ids == (2,)


# Published Gemma 3 shapes (config.json): layers, hidden, heads, KV heads, head_dim, and the
# query_pre_attn_scalar transformers scales attention by.
GEMMA3_SIZES = {
    "1b": (26, 1152, 4, 1, 256, 256),
    "4b": (34, 2560, 8, 4, 256, 256),
    "12b": (48, 3840, 16, 8, 256, 256),
    "27b": (62, 5376, 32, 16, 128, 168),
}


@pytest.mark.parametrize("size", GEMMA3_SIZES)
def test_gemma3_attention_scale_matches_transformers_at_every_size(
    size: str, tiny_gguf: Callable[[str], TinyGGUF], tmp_path: Path
) -> None:
    """GGUF metadata has no query_pre_attn_scalar: it must come out as config.json's, which
    is the head dimension except at 27B (hidden / heads = 168, not 128)."""
    layers, hidden, heads, kv_heads, head_dim, scalar = GEMMA3_SIZES[size]
    shape = replace(
        tiny_gguf("gemma3").config,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
    )
    embedding = {"token_embd.weight": np.zeros((8, hidden), dtype=np.float32)}
    path = write(tmp_path / f"gemma-3-{size}.gguf", shape, embedding)
    config = ModelConfig.from_hf_dict(resolve_model(str(path)).hf_config)
    assert (config.num_layers, config.head_dim) == (layers, head_dim)
    assert config.query_pre_attn_scalar == scalar
