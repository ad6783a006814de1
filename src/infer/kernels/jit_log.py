"""Which Triton kernel variants this process compiled, or loaded from Triton's disk cache,
when, and how long each took.

Triton compiles a kernel again for every new combination of its compile-time constants and
argument attributes (an integer that is 1 or a multiple of 16, a pointer aligned to 16
bytes): a step of a new shape can meet a variant the process has not built, and wait
seconds for it. The log hooks Triton's JIT (``triton.knobs.runtime``): the warm-up lists
what it built, and a variant first met after the engine said it was ready is logged as a
warning, so a gap in the warm-up shows in the server's log with the variant that fell in it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

logger = logging.getLogger(__name__)

SERVING = "serving"  # the part of everything after the start-up
# Without Triton's compilation listener (which says), a variant built faster than this came
# from Triton's disk cache (a compile takes longer).
CACHE_LOAD_S = 0.1


@dataclass(frozen=True)
class KernelVariant:
    """One kernel variant the process built: ``specialization`` names its compile-time
    constants and the argument attributes it was built for; ``part``: what ran it."""

    name: str
    specialization: str
    seconds: float
    part: str
    from_cache: bool
    ahead: bool = False  # in a compiling process (``compile_ahead``), before its launch

    def describe(self) -> str:
        how = "loaded" if self.from_cache else "compiled"
        where = " (ahead, in a compiling process)" if self.ahead else ""
        return f"{self.name}[{self.specialization}] {how} in {self.seconds:.2f} s{where}"


class JitLog:
    """The variants built in this process, each with the part of the start-up (or
    ``serving``) that needed it. ``install`` hooks Triton once; without Triton (CPU
    installs) the log stays empty."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self.variants: list[KernelVariant] = []
        self.ready = False  # then each new variant built while serving is a warning
        self._default_part = "start-up"  # of threads in no part: serving once ready
        self._parts = threading.local()  # each thread's part (a warm-up may run beside)
        self._installed = False
        self._started: dict[str, float] = {}
        self._cache_hits = threading.local()  # the disk cache's answer for this thread's build
        self._ahead: set[str] = set()  # keys built ahead whose launch has not loaded them yet
        self._lock = threading.Lock()

    @property
    def part(self) -> str:
        """The part the calling thread runs."""
        part: str = getattr(self._parts, "part", self._default_part)
        return part

    def install(self) -> bool:
        """Hook Triton's JIT (idempotent); False when this Triton has no hooks."""
        if self._installed:
            return True
        try:
            from triton import knobs
        except ImportError:
            return False
        runtime = knobs.runtime
        if not hasattr(runtime, "jit_cache_hook"):
            return False
        runtime.jit_cache_hook = _chained(runtime.jit_cache_hook, self._before)
        runtime.jit_post_compile_hook = _chained(runtime.jit_post_compile_hook, self._after)
        compilation = knobs.compilation
        if hasattr(compilation, "listener"):  # says whether the disk cache held the variant
            compilation.listener = _chained(compilation.listener, self._compiled)
        self._installed = True
        return True

    @contextmanager
    def running(self, part: str, since: int | None = None) -> Iterator[list[KernelVariant]]:
        """Attribute the variants this thread builds meanwhile to ``part``; yields the list
        they join when it ends, with those other threads built in ``part`` since the log
        held ``since`` variants (default: from now on)."""
        previous = getattr(self._parts, "part", None)
        self._parts.part = part
        start = len(self.variants) if since is None else since
        built: list[KernelVariant] = []
        try:
            yield built
        finally:
            if previous is None:
                del self._parts.part
            else:
                self._parts.part = previous
            built.extend(v for v in self.variants[start:] if v.part == part)

    def mark_ready(self) -> None:
        """The engine is ready: a variant built from now on, outside another start-up's
        parts, delayed a request."""
        self.ready = True
        self._default_part = SERVING

    def built_elsewhere(self, key: str, variant: KernelVariant) -> None:
        """``variant`` was built ahead in another process (``compile_ahead``): logged now,
        with that process's time; its launch's load from the kernel cache is not logged."""
        with self._lock:
            self._ahead.add(key)
            self.variants.append(replace(variant, ahead=True))

    def _before(self, key: Any, **_: Any) -> None:
        with self._lock:
            self._started[str(key)] = self._clock()

    def _compiled(self, cache_hit: bool, **_: Any) -> None:
        self._cache_hits.hit = cache_hit  # read by ``_after`` on the same thread

    def _after(self, key: Any, fn: Any, compile: dict[str, Any], **_: Any) -> None:
        now = self._clock()
        from_cache = getattr(self._cache_hits, "hit", None)
        self._cache_hits.hit = None
        with self._lock:
            seconds = now - self._started.pop(str(key), now)
            ahead = str(key) in self._ahead
            self._ahead.discard(str(key))
        from_cache = loaded_from_cache(seconds, from_cache)
        if ahead and from_cache:  # logged when it was built (compiled again: logged twice)
            return
        name = getattr(fn, "name", "?")
        part = self.part
        variant = KernelVariant(
            name, describe_specialization(fn, compile), seconds, part, from_cache
        )
        self.variants.append(variant)
        if self.ready and part == SERVING:
            logger.warning("kernel variant built after start-up (the warm-up missed it): %s",
                           variant.describe())  # fmt: skip


def loaded_from_cache(seconds: float, cache_hit: bool | None) -> bool:
    """Triton's compilation listener's answer; without one (``None``), a load is fast."""
    return seconds < CACHE_LOAD_S if cache_hit is None else cache_hit


def _chained(previous: Any, hook: Any) -> Any:
    """``hook``, then a hook that was set before (its answer is Triton's answer)."""
    if previous is None:

        def only(**kwargs: Any) -> None:
            hook(**kwargs)

        return only

    def both(**kwargs: Any) -> Any:
        hook(**kwargs)
        return previous(**kwargs)

    return both


def describe_specialization(fn: Any, compile: dict[str, Any]) -> str:
    """``NAME=value`` of each compile-time constant, then the other arguments Triton
    specialised: ``name%16`` (a multiple of 16 or a 16-byte aligned pointer)."""
    try:
        params = [p.name for p in fn.jit_function.params]
        parts = [
            f"{params[path[0]]}={value}"
            for path, value in compile["constants"].items()
            if len(path) == 1 and value is not None
        ]
        for path, attrs in compile["configs"][0].items():
            if len(path) == 1 and any("divisibility" in str(a[0]) for a in attrs):
                parts.append(f"{params[path[0]]}%16")
        return ", ".join(parts)
    except Exception:  # another Triton's layout: the key says it all, less readably
        return str(compile.get("key", ""))[:300]


JIT_LOG = JitLog()  # one per process: Triton's hooks are global
