"""The start-up log: each part of an engine's start-up (loading, the KV cache's profile
step, kernel warm-up, graph capture, the rehearsed first traffic) timed, with every Triton
kernel variant it compiled or loaded from the kernel cache, and its time."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from infer.kernels.jit_log import JIT_LOG, KernelVariant

logger = logging.getLogger(__name__)


@dataclass
class StartUpPart:
    """One part of the start-up: its time and the kernel variants built in it."""

    label: str
    seconds: float = 0.0
    variants: list[KernelVariant] = field(default_factory=list)

    def describe(self) -> str:
        compiled = sum(not v.from_cache for v in self.variants)
        loaded = len(self.variants) - compiled
        if not self.variants:
            return f"{self.label} in {self.seconds:.2f} s"
        return (
            f"{self.label} in {self.seconds:.2f} s; kernel variants: {compiled} compiled, "
            f"{loaded} from the kernel cache"
        )


@contextmanager
def start_up_part(
    label: str, *, log: bool = True, since: int | None = None
) -> Iterator[StartUpPart]:
    """Time the block as one part of the start-up; log it (``log``: this rank logs) with
    each kernel variant built in it (and in other threads' parts of the same label since
    ``since``: ``JitLog.running``)."""
    part = StartUpPart(label)
    start = time.perf_counter()
    try:
        with JIT_LOG.running(label, since) as built:
            yield part
    finally:
        part.seconds = time.perf_counter() - start
        part.variants = built
        if log:
            logger.info("start-up: %s", part.describe())
            for variant in built:
                logger.info("  %s", variant.describe())
