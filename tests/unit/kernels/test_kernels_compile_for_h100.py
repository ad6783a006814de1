"""The FP8 kernels, the rotary K/V write, the norms and the activations compile for an H100,
in every variant the engine launches there (with programmatic dependent launch): the CPU
tests run them interpreted, which accepts code the compiler rejects."""

from __future__ import annotations

import pytest
from tests.unit.kernels.h100_compile import assert_compiles_for_h100

_ROPE_KV_WRITE = """
from infer.kernels.rope_kv_write_triton import _rope_kv_write_kernel
pointers = {{n: "*bf16" for n in ("Q", "K", "V", "CosSin")}}
cache = "*fp8e4nv" if {fp8} else "*bf16"
types = {{**pointers, "KCache": cache, "VCache": cache, "Positions": "*i64",
          "SlotMapping": "*i64", "k_scale": "fp32", "v_scale": "fp32"}}
compile_for_h100(_rope_kv_write_kernel, types, {{"HALF": 64, "BLOCK_SIZE": 16, "BLOCK_HQ": 32,
                 "BLOCK_HK": 8, "BLOCK_HALF": 64, "FP8_CACHE": {fp8}, "PDL": True}})
"""

_FP8_LINEAR = """
from infer.kernels.fp8_linear_triton import _quantize_rows_kernel, _w8a16_kernel
compile_for_h100(_quantize_rows_kernel,
                 {"X": "*bf16", "Q": "*fp8e4nv", "S": "*fp32", "min_scale": "fp32"},
                 {"BLOCK_K": 4096, "FP8_LIMIT": 448.0, "INVERSE_LIMIT": 1.0 / 448.0})
for block_m, use_dot in ((1, False), (16, True), (128, True)):
    kernel = compile_for_h100(
        _w8a16_kernel, {"X": "*bf16", "W": "*fp8e4nv", "Scale": "*fp32", "Out": "*bf16"},
        {"BLOCK_M": block_m, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 1, "EVEN_K": True,
         "EVEN_N": True, "USE_DOT": use_dot, "PDL": True})
    ptx = kernel.asm["ptx"]
    # The next kernel may launch once this one's wait has returned.
    assert ptx.index("griddepcontrol.wait") < ptx.index("griddepcontrol.launch_dependents")
"""

_ROW_KERNELS = """
from infer.kernels.activation_triton import _gated_act_kernel
from infer.kernels.rms_norm_triton import _rms_norm_kernel
for fuse_add in (False, True):
    kernel = compile_for_h100(
        _rms_norm_kernel, {n: "*bf16" for n in ("Out", "X", "Residual", "ResidualOut", "W")}
        | {"eps": "fp32", "offset": "fp32"},
        {"FUSE_ADD": fuse_add, "BLOCK_R": 1, "BLOCK_N": 4096, "PDL": True})
    assert "griddepcontrol.wait" in kernel.asm["ptx"]
for act in ("silu", "gelu_tanh"):
    kernel = compile_for_h100(_gated_act_kernel, {"Out": "*bf16", "X": "*bf16"},
                              {"ACT": act, "BLOCK": 1024, "PDL": True})
    assert "griddepcontrol.wait" in kernel.asm["ptx"]
"""

_SAMPLING = """
from infer.kernels.sampling_triton import _sample_kernel
pointers = {"logits_ptr": "*bf16", "out_ptr": "*i64", "temperature_ptr": "*fp32",
            "top_k_ptr": "*i32", "top_p_ptr": "*fp32", "min_p_ptr": "*fp32", "seed_ptr": "*i64",
            "step_ptr": "*i64", "mask_ptr": "*i32", "mask_rows_ptr": "*i32"}
for has_mask, top_p in ((False, False), (True, True)):
    compile_for_h100(_sample_kernel, pointers,
                     {"HAS_MASK": has_mask, "USE_TOP_P": top_p, "BLOCK": 1024, "PIVOTS": 8,
                      "STAGES": 3, "FAST_LOG": True})
"""

_GATHER = """
from infer.kernels.paged_gather_triton import _gather_kernel
compile_for_h100(_gather_kernel,
                 {"KOut": "*bf16", "VOut": "*bf16", "K": "*fp8e4nv", "V": "*fp8e4nv",
                  "Blocks": "*i64", "k_scale": "fp32", "v_scale": "fp32"},
                 {"BLOCK_SIZE": 16, "HEAD_DIM": 128, "SCALED": True})
"""


@pytest.mark.parametrize("fp8", [False, True])
def test_the_rotary_kv_write_compiles_for_a_gpu(fp8: bool) -> None:
    assert_compiles_for_h100(_ROPE_KV_WRITE.format(fp8=fp8))


def test_the_fp8_linear_kernels_compile_for_a_gpu() -> None:
    assert_compiles_for_h100(_FP8_LINEAR)


def test_the_norm_and_activation_kernels_compile_for_a_gpu() -> None:
    assert_compiles_for_h100(_ROW_KERNELS)


def test_the_sampling_kernel_compiles_for_a_gpu() -> None:
    assert_compiles_for_h100(_SAMPLING)


def test_the_fp8_gather_compiles_for_a_gpu() -> None:
    assert_compiles_for_h100(_GATHER)
