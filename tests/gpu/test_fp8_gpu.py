"""On a GPU: FP8 weights through ``torch._scaled_mm`` compute what the CPU reference of the
same W8A8 math computes, and CUDA graphs (which capture the FP8 matmuls) change nothing."""

from __future__ import annotations

import pytest
import torch
from tests.gpu.test_models_gpu import CONFIGS, _generate, checkpoints  # noqa: F401 (fixture)

from infer.attention import ScheduledSequence, build_metadata
from infer.loader import load_model, resolve_model
from infer.models import DecoderModel

pytestmark = pytest.mark.gpu


def _prefill_logits(model: DecoderModel, prompt: list[int], device: torch.device) -> torch.Tensor:
    config, dtype = model.config, model.lm_head.weight.dtype
    blocks = -(-len(prompt) // 16)
    shape = (config.num_layers, blocks, config.num_kv_heads, 16, config.head_dim)
    model.bind_kv_cache(
        torch.zeros(shape, dtype=dtype, device=device),
        torch.zeros(shape, dtype=dtype, device=device),
    )
    ids, meta = build_metadata([ScheduledSequence(list(range(blocks)), 0, prompt)], 16, device)
    with torch.no_grad():
        return model.compute_logits(model(ids, meta)).float().cpu()


@pytest.mark.parametrize("family", CONFIGS)
def test_scaled_mm_model_matches_the_cpu_reference(
    family: str,
    checkpoints: dict[str, str],  # noqa: F811
) -> None:
    source = resolve_model(checkpoints[family])
    prompt = list(range(10, 310))
    logits = {}
    for device, dtype in (
        (torch.device("cuda"), torch.bfloat16),
        (torch.device("cpu"), torch.float32),
    ):
        model, _ = load_model(source, device, dtype, 1024, "dummy", quantization="fp8")
        logits[device.type] = _prefill_logits(model, prompt, device)
    error = (logits["cuda"] - logits["cpu"]).norm() / logits["cpu"].norm()
    assert error < 0.02  # bf16 activations and outputs against float32, same FP8 weights


@pytest.mark.parametrize("family", CONFIGS)
def test_cuda_graphs_replay_the_fp8_model(
    family: str,
    checkpoints: dict[str, str],  # noqa: F811
) -> None:
    eager = _generate(checkpoints[family], quantization="fp8", use_cuda_graphs=False)
    assert _generate(checkpoints[family], quantization="fp8") == eager
