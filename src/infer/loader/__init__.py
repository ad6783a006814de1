"""Turns ``--model`` (built-in name, ``.gguf`` file, HF directory or Hub id) into a model.

The model is built on the ``meta`` device, materialised once on the target device in the
target dtype, then filled from the checkpoint (or randomly for ``--load-format dummy``),
with a progress bar and an error naming any missing, unexpected or misshapen tensor.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from tqdm import tqdm

from infer.config import ModelConfig
from infer.distributed.group import SINGLE, ParallelGroup
from infer.loader.dummy import fill_dummy_weights
from infer.loader.gguf import GGUFFile
from infer.loader.presets import DEFAULT_MODEL, embedded_model_path, preset_config, preset_names
from infer.loader.quantization import KV_SCALE_SUFFIXES, fp8_checkpoint, fp8_tensors
from infer.loader.safetensors import SafetensorsCheckpoint, download_from_hub
from infer.models import DecoderModel, model_class
from infer.models.parallel_layers import CheckpointTensor

# Checkpoint tensors that are not weights of the text decoder.
_SKIPPED_PREFIXES = (
    "vision_tower.",
    "multi_modal_projector.",
    "model.vision_tower.",
    "model.multi_modal_projector.",
)
_SKIPPED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass
class ModelSource:
    """Where a model's configuration, weights and tokenizer come from."""

    name: str
    kind: Literal["gguf", "safetensors", "preset"]
    hf_config: dict[str, Any]
    path: Path | None = None  # .gguf file or checkpoint directory
    # The opened GGUF file, kept so that its (slow to parse) metadata is read only once.
    gguf: GGUFFile | None = field(default=None, repr=False)

    @property
    def tokenizer_path(self) -> Path | None:
        return self.path


def open_gguf(path: Path) -> GGUFFile:
    """The opened GGUF file, parsed once per process while it is unchanged: parsing its
    metadata (a vocabulary's 100,000s of strings) takes over a second, and a process may
    resolve one model several times (a benchmark and its engine, tests)."""
    stat = path.stat()
    return _parsed_gguf(path.resolve(), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=2)
def _parsed_gguf(path: Path, mtime_ns: int, size: int) -> GGUFFile:
    return GGUFFile(path)


def resolve_model(model: str) -> ModelSource:
    """Find the model behind a ``--model`` value."""
    if model == DEFAULT_MODEL:
        model = str(embedded_model_path())
    preset = preset_config(model)
    if preset is not None:
        return ModelSource(model, "preset", preset)
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"model file {path} does not exist")
        gguf_file = open_gguf(path)
        return ModelSource(path.name, "gguf", gguf_file.hf_config(), path, gguf_file)
    if path.is_dir():
        return ModelSource(path.name, "safetensors", SafetensorsCheckpoint(path).config, path)
    if path.exists() or model.startswith((".", "/", "~")) or model.count("/") != 1:
        raise FileNotFoundError(
            f"model {model!r} is not a .gguf file, a checkpoint directory, a Hub id "
            f"(owner/name) or a built-in name ({', '.join([DEFAULT_MODEL, *preset_names()])})"
        )
    directory = download_from_hub(model)
    return ModelSource(model, "safetensors", SafetensorsCheckpoint(directory).config, directory)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_model(
    config: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    max_positions: int,
    group: ParallelGroup = SINGLE,
    fp8: bool = False,
) -> DecoderModel:
    """An uninitialised model (``group``'s rank's share of it) with its storage on
    ``device``, its decoder projections in FP8 when ``fp8``; weights must be loaded next."""
    with torch.device("meta"), _default_dtype(dtype):
        model = model_class(config)(config, group)
        if fp8:
            model.use_fp8_weights()
    model.to_empty(device=device)
    model.tie_weights()
    model.init_buffers(max_positions)
    return model.eval()


@torch.no_grad()
def load_checkpoint(
    model: DecoderModel,
    tensors: Iterator[tuple[str, CheckpointTensor]],
    total: int,
    label: str,
    fp8_scales: bool = False,
) -> None:
    """Copy every checkpoint tensor into ``model``; all expected tensors must appear (with
    ``fp8_scales``, the scale of every FP8 projection too)."""
    expected = model.expected_weights(fp8_scales)
    loaded: set[str] = set()
    for name, tensor in tqdm(
        tensors, total=total, desc=f"Loading {label}", unit="tensor", leave=False
    ):
        if name.startswith(_SKIPPED_PREFIXES) or name.endswith(_SKIPPED_SUFFIXES):
            continue
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        if name.endswith(KV_SCALE_SUFFIXES) and model.load_weight(name, tensor):
            continue  # optional: an FP8 KV cache without them scales by 1
        # Checked against the expected names first: a layer index beyond the model's depth
        # would otherwise fail inside ``load_weight`` without naming the tensor.
        if name not in expected or not model.load_weight(name, tensor):
            raise ValueError(f"tensor {name}: not a weight of {type(model).__name__}")
        loaded.add(name)
    missing = sorted(expected - loaded)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"tensor {missing[0]}: missing from the checkpoint{more}")


def load_model(
    source: ModelSource,
    device: torch.device,
    dtype: torch.dtype,
    max_positions: int,
    load_format: str = "auto",
    seed: int = 0,
    group: ParallelGroup = SINGLE,
    quantization: str | None = None,
) -> tuple[DecoderModel, ModelConfig]:
    """Build ``source``'s model (``group``'s rank's share) on ``device`` and fill its
    weights. A GGUF tensor is dequantised whole, then sliced; a safetensors rank reads only
    its slices; dummy weights are drawn whole from the seed, then sliced, so every
    ``tensor_parallel_size`` computes the same model. With ``quantization="fp8"`` each
    rank quantises its slices; an FP8 checkpoint loads as it is, with or without it."""
    config = ModelConfig.from_hf_dict(source.hf_config)
    fp8_format = fp8_checkpoint(source.hf_config) if source.kind == "safetensors" else None
    if source.kind == "preset" and load_format != "dummy":
        raise ValueError(
            f"load_format: preset {source.name!r} has shapes but no weights; "
            "use --load-format dummy"
        )
    if load_format not in ("auto", "dummy", source.kind):
        raise ValueError(
            f"load_format: {load_format!r} does not match {source.name} (a {source.kind} model)"
        )
    fp8 = fp8_format is not None or quantization == "fp8"
    model = build_model(config, device, dtype, max_positions, group, fp8)
    if load_format == "dummy":
        fill_dummy_weights(model, seed)
    elif source.kind == "gguf":
        assert source.path is not None
        gguf_file = source.gguf or open_gguf(source.path)
        load_checkpoint(
            model,
            gguf_file.tensors(config.num_heads, config.num_kv_heads),
            gguf_file.num_tensors(),
            source.name,
        )
    else:
        assert source.path is not None
        checkpoint = SafetensorsCheckpoint(source.path)
        tensors = checkpoint.tensors()
        if fp8_format is not None:
            tensors = fp8_tensors(tensors, fp8_format)
        as_stored = fp8_format is not None and fp8_format.block is None  # with their scales
        load_checkpoint(model, tensors, checkpoint.num_tensors(), source.name, as_stored)
    return model, config
