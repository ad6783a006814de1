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
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    gpu_model, _ = load_model(source, cuda, torch.bfloat16, 1024, "dummy", quantization="fp8")
    cpu_model, _ = load_model(source, cpu, torch.float32, 1024, "dummy", quantization="fp8")
    # Dummy weights come from each device's own generator: give the CPU model the GPU's.
    cpu_model.load_state_dict({name: t.cpu() for name, t in gpu_model.state_dict().items()})
    on_gpu = _prefill_logits(gpu_model, prompt, cuda)
    on_cpu = _prefill_logits(cpu_model, prompt, cpu)
    error = (on_gpu - on_cpu).norm() / on_cpu.norm()
    assert error < 0.02  # bf16 activations and outputs against float32, same FP8 weights


@pytest.mark.parametrize("family", CONFIGS)
def test_cuda_graphs_replay_the_fp8_model(
    family: str,
    checkpoints: dict[str, str],  # noqa: F811
) -> None:
    eager = _generate(checkpoints[family], quantization="fp8", use_cuda_graphs=False)
    assert _generate(checkpoints[family], quantization="fp8") == eager
