"""Kernel variants compiled ahead in compiling processes, on the GPU: the launch afterwards
loads what they built (no second compile) and computes what the torch reference does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from infer.kernels.compile_ahead import CompilerProcesses, compile_ahead
from infer.kernels.jit_log import JIT_LOG
from infer.kernels.rms_norm import rms_norm_torch
from infer.kernels.rms_norm_triton import rms_norm_triton

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_a_variant_compiled_ahead_is_loaded_by_its_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # empty: the variant compiles
    cuda = torch.device("cuda")
    compilers = CompilerProcesses.for_device(cuda)
    assert compilers is not None
    # float16 rows of an odd width: a variant no other test in this process built.
    x = torch.randn(7, 776, device=cuda, dtype=torch.float16)
    weight = torch.randn(776, device=cuda, dtype=torch.float16)
    start = len(JIT_LOG.variants)
    try:
        compile_ahead(compilers, lambda: rms_norm_triton(x, weight, 1e-6))
        out = rms_norm_triton(x, weight, 1e-6)
    finally:
        compilers.close()
    built = JIT_LOG.variants[start:]
    assert [(v.name, v.ahead, v.from_cache) for v in built] == [("_rms_norm_kernel", True, False)]
    torch.testing.assert_close(out, rms_norm_torch(x, weight, 1e-6), atol=2e-2, rtol=2e-2)
