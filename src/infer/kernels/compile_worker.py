"""A process that compiles Triton kernel variants into the kernel cache, for
``infer.kernels.compile_ahead``.

    python -m infer.kernels.compile_worker '["cuda", 90, 32]'

Each line on stdin names a variant as Triton's JIT described it (the kernel's module and
name, Triton's specialisation data); the process compiles it for the target given (Triton's
``GPUTarget``: no GPU is touched here) into the kernel cache its environment names, and
answers one JSON line: the seconds it took and whether the cache already held it, or the
error. Anything else that writes to stdout goes to stderr, so the answers stay whole.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from typing import Any, TextIO

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction, convert_to_tuple_if_list


@triton.jit
def _nothing(x):
    pass


def compile_variant(task: dict[str, str], target: GPUTarget) -> dict[str, Any]:
    """Compile the variant ``task`` names (``module``, ``name``, ``data``); its time, and
    whether the kernel cache held it (None: this Triton does not say)."""
    start = time.perf_counter()
    hits: list[bool] = []
    compilation = triton.knobs.compilation
    if hasattr(compilation, "listener"):
        compilation.listener = lambda cache_hit, **_: hits.append(cache_hit)
    source, options = _source(_jit_function(task["module"], task["name"]), json.loads(task["data"]))
    triton.compile(source, target=target, options=options)
    return {"seconds": time.perf_counter() - start, "cache_hit": hits[-1] if hits else None}


def _jit_function(module: str, name: str) -> JITFunction[Any]:
    found: Any = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    while not isinstance(found, JITFunction):  # under an autotuner or heuristics
        found = found.fn
    return found


def _source(kernel: JITFunction[Any], data: dict[str, Any]) -> tuple[ASTSource, dict[str, Any]]:
    """What ``JITFunction.preload`` builds from the same data: the JIT's own source and
    options, so the cache key is the one the launch will look for."""
    constants = {
        tuple(key): _constant(value)
        for key, value in zip(data["constant_keys"], data["constant_vals"], strict=True)
    }
    attrs = {
        tuple(key): value for key, value in zip(data["attrs_keys"], data["attrs_vals"], strict=True)
    }
    signature = {key: convert_to_tuple_if_list(value) for key, value in data["signature"].items()}
    options = {key: tuple(v) if isinstance(v, list) else v for key, v in data["options"].items()}
    return ASTSource(kernel, signature, constants, attrs), options


def _constant(value: Any) -> Any:
    if tl.dtype.is_dtype(value):
        return tl.dtype(value)
    if isinstance(value, dict) and "constexpr" in value:
        return tl.constexpr(convert_to_tuple_if_list(value["constexpr"]))
    if isinstance(value, dict) and "jit_function" in value:
        module, name = value["jit_function"].split(":")
        return _jit_function(module, name)
    return convert_to_tuple_if_list(value)


def serve(target: GPUTarget, tasks: TextIO, answers: TextIO) -> None:
    """Answer each task line until stdin closes."""
    for line in tasks:
        try:
            answer = compile_variant(json.loads(line), target)
        except Exception as error:  # the launch compiles it as it would have
            answer = {"error": repr(error)}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def main(argv: list[str]) -> None:
    target = GPUTarget(*json.loads(argv[0]))
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # prints and the compiler's output
    # Triton's own first-compile set-up now, not in the first variant asked for.
    triton.compile(ASTSource(_nothing, {"x": "*fp32"}, {}), target=target)
    serve(target, sys.stdin, answers)


if __name__ == "__main__":
    main(sys.argv[1:])
