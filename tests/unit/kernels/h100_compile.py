"""Compiling Triton kernels for an H100 on a machine without one. The interpreter runs what
Triton's compiler rejects (a size that is not a constexpr, a return typed differently past
a constexpr branch), so each kernel's GPU variants are compiled too, in a process of their
own: the tests' kernels are the interpreter's."""

from __future__ import annotations

import os
import subprocess
import sys

_PRELUDE = """
import inspect
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

def compile_for_h100(kernel, types, constants, default="i32"):
    names = list(inspect.signature(kernel.fn).parameters)
    signature = {n: "constexpr" if n in constants else types.get(n, default) for n in names}
    constexprs = {(names.index(n),): v for n, v in constants.items()}
    return triton.compile(
        ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", 90, 32)
    )
"""


def assert_compiles_for_h100(script: str) -> None:
    """Run ``script``, which calls ``compile_for_h100(kernel, types, constants)`` (argument
    types by name, ``i32`` unless given), and fail with the compiler's error."""
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", _PRELUDE + script], env=environment, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
