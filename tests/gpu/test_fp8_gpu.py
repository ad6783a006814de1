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
    # Dummy weights come from each device's own generator: the CPU models take the GPU's.
    weights = {name: t.cpu() for name, t in gpu_model.state_dict().items()}
    logits = {"gpu": _prefill_logits(gpu_model, prompt, cuda)}
    for dtype in (torch.float32, torch.bfloat16):
        cpu_model, _ = load_model(source, cpu, dtype, 1024, "dummy", quantization="fp8")
        cpu_model.load_state_dict(weights)
        logits[str(dtype)] = _prefill_logits(cpu_model, prompt, cpu)
    reference = logits[str(torch.float32)]

    def error(name: str) -> float:
        return float((logits[name] - reference).norm() / reference.norm())

    # Each layer quantises its bf16 activations, and a value that rounds to the next FP8 step
    # changes what follows: through a few random layers, the CPU's own bf16 run of the same
    # math ends 7-10 % from float32. The GPU's must end no further (a wrong scale: ~100 %).
    assert error("gpu") < 1.5 * error(str(torch.bfloat16)) + 0.01


@pytest.mark.parametrize("family", CONFIGS)
def test_cuda_graphs_replay_the_fp8_model(
    family: str,
    checkpoints: dict[str, str],  # noqa: F811
) -> None:
    eager = _generate(checkpoints[family], quantization="fp8", use_cuda_graphs=False)
    assert _generate(checkpoints[family], quantization="fp8") == eager
