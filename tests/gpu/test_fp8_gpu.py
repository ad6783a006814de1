"""On a GPU: FP8 weights (W8A16 kernel for few rows, ``torch._scaled_mm`` for many) compute
what the CPU reference of the same math computes; an FP8 KV cache written and read by the
Triton kernels matches the torch attention path over the same cache; CUDA graphs (which
capture both) change nothing."""

from __future__ import annotations

import pytest
import torch
from tests.gpu.test_models_gpu import (  # noqa: F401 (fixture)
    CONFIGS,
    _generate,
    _torch_attention,
    checkpoints,
)

from infer.attention import ScheduledSequence, build_metadata
from infer.loader import load_model, resolve_model
from infer.models import DecoderModel

pytestmark = pytest.mark.gpu


def _prefill_logits(
    model: DecoderModel,
    prompt: list[int],
    device: torch.device,
    kv_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    config, dtype = model.config, kv_dtype or model.lm_head.weight.dtype
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


@pytest.mark.parametrize("family", CONFIGS)
def test_cuda_graphs_replay_fp8_weights_and_an_fp8_cache(
    family: str,
    checkpoints: dict[str, str],  # noqa: F811
) -> None:
    options = {"quantization": "fp8", "kv_cache_dtype": "fp8"}
    eager = _generate(checkpoints[family], use_cuda_graphs=False, **options)
    assert _generate(checkpoints[family], **options) == eager


@pytest.mark.parametrize("family", CONFIGS)
def test_triton_reads_an_fp8_cache_as_the_torch_path_does(
    family: str,
    checkpoints: dict[str, str],  # noqa: F811
) -> None:
    """Prefill logits over an FP8 cache (the K/V write and attention kernels, windows for
    Gemma) against the torch path's over one; the FP8 cache's own error (against bf16)
    is the yardstick: the two readings must be closer to each other than to it."""
    source = resolve_model(checkpoints[family])
    prompt = list(range(10, 310))
    cuda = torch.device("cuda")
    model, _ = load_model(source, cuda, torch.bfloat16, 1024, "dummy")
    logits = {"triton": _prefill_logits(model, prompt, cuda, torch.float8_e4m3fn)}
    with _torch_attention():
        logits["torch"] = _prefill_logits(model, prompt, cuda, torch.float8_e4m3fn)
        logits["bf16"] = _prefill_logits(model, prompt, cuda)

    def distance(a: str, b: str) -> float:
        return float((logits[a] - logits[b]).norm() / logits[b].norm())

    assert distance("triton", "torch") < max(0.5 * distance("torch", "bf16"), 0.02)
    assert distance("torch", "bf16") > 0  # the cache really was FP8
