"""A compiling process builds a variant for an H100 on a machine without one, into the kernel
cache, under the key the launch will look for: Triton's own specialisation data in, the
JIT's own source and options afterwards find it there."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import serialize_specialization_data

from infer.kernels.compile_ahead import CompilerProcesses, RecordedVariant
from infer.kernels.rms_norm_triton import _rms_norm_kernel

TARGET = GPUTarget("cuda", 90, 32)
MODULE = "infer.kernels.rms_norm_triton"


class Variant:
    """One variant of the RMS norm kernel as Triton's JIT holds it before compiling."""

    def __init__(self, fuse_add: bool) -> None:
        names = list(inspect.signature(_rms_norm_kernel.fn).parameters)
        pointers = ("Out", "X", "Residual", "ResidualOut", "W")
        constants = {"FUSE_ADD": fuse_add, "BLOCK_R": 1, "BLOCK_N": 4096, "PDL": False}
        types = {n: "*bf16" for n in pointers} | {"eps": "fp32", "offset": "fp32"}
        self.signature = {n: "constexpr" if n in constants else types.get(n, "i32") for n in names}
        self.constants = {(names.index(n),): v for n, v in constants.items()}
        self.attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in pointers}
        self.options = make_backend(TARGET).parse_options({})

    def recorded(self, key: str) -> RecordedVariant:
        """What the JIT hands its cache hook, as ``compile_ahead`` records it."""
        given = {
            "name": f"{MODULE}._rms_norm_kernel", "signature": self.signature,
            "constants": self.constants, "attrs": self.attrs, "options": self.options,
            "key": key, "target": TARGET,
        }  # fmt: skip
        wanted = inspect.signature(serialize_specialization_data).parameters
        data = serialize_specialization_data(**{k: v for k, v in given.items() if k in wanted})
        return RecordedVariant(key, MODULE, "_rms_norm_kernel", "", data)

    def compile_as_the_jit_does(self) -> bool | None:
        """The launch's compile (``JITFunction._do_compile``): whether the cache held it.
        Run it in a process without the interpreter (``launch_compile``)."""
        hits: list[bool] = []
        triton.knobs.compilation.listener = lambda cache_hit, **_: hits.append(cache_hit)
        try:
            source = ASTSource(_rms_norm_kernel, self.signature, self.constants, self.attrs)
            triton.compile(source, target=TARGET, options=self.options.__dict__)
        finally:
            triton.knobs.compilation.listener = None
        return hits[-1] if hits else None


def launch_compile(fuse_add: bool) -> bool | None:
    """``compile_as_the_jit_does`` in a process of its own: the tests' kernels here are
    the interpreter's."""
    script = (
        "from tests.unit.kernels.test_compile_worker import Variant\n"
        f"print(Variant(fuse_add={fuse_add}).compile_as_the_jit_does())"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    answer: bool | None = {"True": True, "False": False}.get(done.stdout.split()[-1])
    return answer


@pytest.fixture
def kernel_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return tmp_path


def test_a_variant_compiled_in_a_worker_is_the_one_its_launch_loads(kernel_cache: Path) -> None:
    plain, fused = Variant(fuse_add=False), Variant(fuse_add=True)
    compilers = CompilerProcesses(2, ("cuda", 90, 32))
    try:
        answers = compilers.build([plain.recorded("plain"), fused.recorded("fused")])
        again = compilers.build([plain.recorded("plain")])
    finally:
        compilers.close()
    assert answers["plain"]["cache_hit"] is False and answers["fused"]["cache_hit"] is False
    assert answers["plain"]["seconds"] > 0
    assert again["plain"]["cache_hit"] is True
    assert launch_compile(fuse_add=False) is True
    assert launch_compile(fuse_add=True) is True
    assert any(kernel_cache.rglob("_rms_norm_kernel.cubin"))


def test_a_variant_that_fails_is_answered_with_its_error_and_the_worker_goes_on(
    kernel_cache: Path,
) -> None:
    broken = RecordedVariant("broken", MODULE, "no_such_kernel", "", json.dumps({}))
    compilers = CompilerProcesses(1, ("cuda", 90, 32))
    try:
        answers = compilers.build([broken])
        after = compilers.build([Variant(fuse_add=False).recorded("after")])
    finally:
        compilers.close()
    assert "no_such_kernel" in answers["broken"]["error"]
    assert after["after"]["cache_hit"] is False


def test_a_dead_worker_leaves_its_variants_to_their_launches(kernel_cache: Path) -> None:
    compilers = CompilerProcesses(1, ("cuda", 90, 32))
    worker: Any = compilers._workers[0]
    worker.kill()
    worker.wait()
    try:
        answers = compilers.build([Variant(False).recorded("a"), Variant(True).recorded("b")])
    finally:
        compilers.close()
    assert "exited" in answers["a"]["error"] or "exited" in answers["b"]["error"]
    assert {"a", "b"} == set(answers) and all("error" in a for a in answers.values())
