"""On a Hopper GPU: kernels launched with programmatic dependent launch compute exactly what
they compute without it, in CUDA graphs replayed on fresh inputs (a kernel that read before
its wait would see the previous replay's values) and in a model's greedy generations."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from tests.gpu.test_models_gpu import CONFIGS, _generate, checkpoints  # noqa: F401 (fixture)

from infer.kernels.activation_triton import silu_and_mul_triton
from infer.kernels.fp8_linear_triton import w8a16_linear_triton, w8a16_tile
from infer.kernels.pdl import pdl_enabled
from infer.kernels.rms_norm_triton import fused_add_rms_norm_triton
from infer.models.fp8 import quantize_rows

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
        reason="programmatic dependent launch needs a Hopper or later GPU",
    ),
]


def _captured(run: Callable[[], torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    run()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    return graph, out


@pytest.mark.parametrize("rows", [1, 8])
def test_a_graph_of_pdl_launches_computes_what_plain_launches_compute(
    rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden, inner = 3072, 8192
    weights = [
        quantize_rows(torch.randn(n, k, generator=gen, device="cuda", dtype=torch.bfloat16))
        for n, k in ((2 * inner, hidden), (hidden, inner))
    ] * 4
    x = torch.zeros(rows, hidden, device="cuda", dtype=torch.bfloat16)
    norm_weight = torch.ones(hidden, device="cuda", dtype=torch.bfloat16)

    def linear(a: torch.Tensor, index: int) -> torch.Tensor:
        q, s = weights[index]
        return w8a16_linear_triton(a, q, s, w8a16_tile(a.shape[0], *q.shape))

    def run() -> torch.Tensor:
        hidden_state, residual = x, torch.zeros_like(x)
        for layer in range(len(weights) // 2):
            normed, residual = fused_add_rms_norm_triton(hidden_state, residual, norm_weight, 1e-5)
            gated = silu_and_mul_triton(linear(normed, 2 * layer))
            hidden_state = linear(gated, 2 * layer + 1)
        return hidden_state

    graphs = {}
    for pdl in (False, True):
        monkeypatch.setenv("INFER_DISABLE_PDL", "0" if pdl else "1")
        assert pdl_enabled(x) == pdl
        graphs[pdl] = _captured(run)
    for replay in range(50):
        x.copy_(torch.randn(x.shape, generator=gen, device="cuda", dtype=x.dtype))
        outputs = []
        for graph, out in graphs.values():
            graph.replay()
            outputs.append(out.clone())
        assert torch.equal(outputs[0], outputs[1]), f"replay {replay}"


@pytest.mark.parametrize("family", CONFIGS)
def test_pdl_changes_no_generated_token(
    family: str,
    checkpoints: dict[str, str],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with_pdl = _generate(checkpoints[family], quantization="fp8")
    monkeypatch.setenv("INFER_DISABLE_PDL", "1")
    assert _generate(checkpoints[family], quantization="fp8") == with_pdl
