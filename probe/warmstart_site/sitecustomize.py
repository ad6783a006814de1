"""Probe instrumentation for ``probe/warmstart_first_burst.py`` (imported by every Python
process started with this folder first on PYTHONPATH; does nothing unless
``WARMSTART_PROBE_DIR`` is set).

In each process, a daemon thread:
- installs Triton's JIT hooks once ``triton`` is imported: every kernel variant the process
  compiles or loads from the disk cache, with its specialisation and seconds, to
  ``compiles-<pid>.jsonl``;
- once ``infer.engine.engine`` is imported, wraps ``Engine.step`` / ``_launched`` /
  ``dashboard_view`` and the engine process's outbox: each step's wall time and make-up, each
  view's and each event's pickling time, to ``steps-<pid>.jsonl``;
- samples every thread's Python stack every ``WARMSTART_SAMPLE_MS`` (default 10) ms and counts
  collapsed stacks per window (the window label is read from ``<dir>/window``), to
  ``samples-<pid>.json``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

_DIR = os.environ.get("WARMSTART_PROBE_DIR")


def _main() -> None:
    assert _DIR is not None
    pid = os.getpid()
    role = " ".join(sys.argv[:3])[-120:]
    compiles = open(os.path.join(_DIR, f"compiles-{pid}.jsonl"), "a", buffering=1)  # noqa: SIM115
    steps_file = open(os.path.join(_DIR, f"steps-{pid}.jsonl"), "a")  # noqa: SIM115
    window_path = os.path.join(_DIR, "window")
    state = {"window": "start"}
    started: dict[str, float] = {}
    lock = threading.Lock()

    def window() -> str:
        return state["window"]

    def cache_hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled):  # noqa: A002
        started[str(key)] = time.perf_counter()
        return None

    def post_hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled):  # noqa: A002
        took = time.perf_counter() - started.pop(str(key), time.perf_counter())
        line = {"pid": pid, "wall": time.time(), "window": window(), "name": fn.name,
                "s": round(took, 4), "repr": repr, "key": str(key)}  # fmt: skip
        compiles.write(json.dumps(line) + "\n")
        return None

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        line = {"pid": pid, "wall": time.time(), "window": window(), "listener": True,
                "name": metadata.get("name"), "cache_hit": cache_hit,
                "us": getattr(times, "total", None), "hash": metadata.get("hash")}  # fmt: skip
        compiles.write(json.dumps(line) + "\n")

    def install_triton() -> bool:
        if "triton" not in sys.modules:
            return False
        try:
            from triton import knobs

            knobs.runtime.jit_cache_hook = cache_hook
            knobs.runtime.jit_post_compile_hook = post_hook
            if hasattr(knobs.compilation, "listener"):
                knobs.compilation.listener = listener
        except Exception as exc:  # an older Triton: say so, go on
            compiles.write(json.dumps({"pid": pid, "hook_error": repr(exc)}) + "\n")
        return True

    def record(kind: str, **fields: object) -> None:
        line = {"kind": kind, "wall": round(time.time(), 4), "window": window(), **fields}
        with lock:
            steps_file.write(json.dumps(line) + "\n")

    def install_engine() -> bool:
        module = sys.modules.get("infer.engine.engine")
        if module is None or not hasattr(module, "Engine"):
            return False
        engine_cls = module.Engine
        step, launched, view = engine_cls.step, engine_cls._launched, engine_cls.dashboard_view
        shape: dict[str, object] = {}

        def timed_step(self):  # type: ignore[no-untyped-def]
            begin = time.perf_counter()
            outputs = step(self)
            took = time.perf_counter() - begin
            if shape:
                import torch

                record("step", s=round(took, 6), graphed=self.runner.graphed,
                       reserved_mb=torch.cuda.memory_reserved() >> 20, **shape)  # fmt: skip
                shape.clear()
            return outputs

        def timed_launched(self, scheduled):  # type: ignore[no-untyped-def]
            chunks = scheduled.chunks
            shape["tokens"] = shape.get("tokens", 0) + scheduled.num_tokens
            shape["rows"] = shape.get("rows", 0) + len(chunks)
            shape["decode"] = shape.get("decode", 0) + sum(c.num_tokens == 1 for c in chunks)
            return launched(self, scheduled)

        def timed_view(self):  # type: ignore[no-untyped-def]
            begin = time.perf_counter()
            out = view(self)
            record("view", s=round(time.perf_counter() - begin, 6))
            return out

        engine_cls.step, engine_cls._launched = timed_step, timed_launched
        engine_cls.dashboard_view = timed_view
        return True

    def install_outbox() -> bool:
        module = sys.modules.get("infer.server.engine_process")
        if module is None or not hasattr(module, "_Outbox"):
            return False
        send = module._Outbox.send

        def timed_send(self, event):  # type: ignore[no-untyped-def]
            begin = time.perf_counter()
            send(self, event)
            took = time.perf_counter() - begin
            if type(event).__name__ != "StepEvents" or took > 0.001:
                record("send", event=type(event).__name__, s=round(took, 6))

        module._Outbox.send = timed_send
        return True

    sample_s = float(os.environ.get("WARMSTART_SAMPLE_MS", "10")) / 1000
    counts: dict[tuple[str, str, str], int] = {}
    samples_path = os.path.join(_DIR, f"samples-{pid}.json")

    def flush() -> None:
        rows = [{"window": w, "thread": t, "stack": s, "n": n} for (w, t, s), n in counts.items()]
        with open(samples_path + ".tmp", "w") as out:
            json.dump({"pid": pid, "role": role, "rows": rows}, out)
        os.replace(samples_path + ".tmp", samples_path)
        with lock:
            steps_file.flush()

    def collapse(frame) -> str:  # type: ignore[no-untyped-def]
        names = []
        while frame is not None and len(names) < 40:
            code = frame.f_code
            names.append(f"{os.path.basename(code.co_filename)}:{code.co_name}:{frame.f_lineno}")
            frame = frame.f_back
        return ";".join(reversed(names))

    def run() -> None:
        triton_done = engine_done = outbox_done = False
        me = threading.get_ident()
        last_flush = last_window = time.monotonic()
        while True:
            time.sleep(sample_s)
            now = time.monotonic()
            if now - last_window > 0.25:
                last_window = now
                try:
                    with open(window_path) as handle:
                        state["window"] = handle.read().strip() or state["window"]
                except OSError:
                    pass
                triton_done = triton_done or install_triton()
                engine_done = engine_done or install_engine()
                outbox_done = outbox_done or install_outbox()
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                key = (state["window"], names.get(ident, str(ident)), collapse(frame))
                counts[key] = counts.get(key, 0) + 1
            if now - last_flush > 3.0:
                last_flush = now
                try:
                    flush()
                except Exception:
                    pass

    threading.Thread(target=run, name="warmstart-probe", daemon=True).start()


if _DIR:
    try:
        _main()
    except Exception as exc:  # never break the process being probed
        print(f"warmstart probe: not installed: {exc!r}", file=sys.stderr)
