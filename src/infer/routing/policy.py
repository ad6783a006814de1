"""The cache-aware routing policy: prefix affinity, balanced against load.

For each request the policy compares the prompt's block hashes (``prefix_blocks.py``) with
what each healthy worker has been sent (``prefix_index.py``) and picks:

1. the worker holding the longest prefix, when that prefix is at least ``cache_threshold``
   of the prompt's blocks and the worker is not overloaded; among workers holding equally
   long prefixes, the least loaded;
2. otherwise the least loaded worker that is not overloaded (ties: the longer cached
   prefix, then the fewest requests routed, so that at low load, where affinity leaves
   workers unevenly used, prompts without affinity even them out; a worker that joins
   or rejoins counts as many as the least used one, not zero, or it would get them all).

A worker is overloaded when its load (requests in flight) exceeds the least loaded
worker's by more than ``balance_abs_threshold`` *and* is more than
``balance_rel_threshold`` times it, or when its KV cache is at least ``kv_high_water`` full
while another's is not. Both load conditions must hold so that small absolute gaps at low
load (2 against 1) and small relative gaps at high load (100 against 90) keep affinity.
A hot prefix thus stays on one worker until that worker runs ahead of the others; then it
spills to the least loaded, which caches it too, and the two share it by load.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

from infer.routing.prefix_blocks import RoutingKey, block_hashes
from infer.routing.prefix_index import PrefixIndex


@dataclass(frozen=True)
class RoutingSettings:
    """The policy's thresholds (see the module's docstring) and its prefix view's units."""

    cache_threshold: float = 0.5  # of the prompt's blocks, held by a worker, for affinity
    balance_abs_threshold: int = 8  # requests in flight beyond the least loaded worker's
    balance_rel_threshold: float = 1.5  # times the least loaded worker's requests
    kv_high_water: float = 0.95  # KV use (fraction of blocks) from which a worker is full
    tokens_per_block: int = 16  # the engine's KV block size
    chars_per_block: int = 64  # text: about as many characters as a block's tokens
    blocks_per_worker: int = 1 << 16  # the prefix view's bound, per worker

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold: must be in [0, 1], got {self.cache_threshold}")
        if self.balance_abs_threshold < 0:
            raise ValueError(
                f"balance_abs_threshold: must be >= 0, got {self.balance_abs_threshold}"
            )
        if self.balance_rel_threshold < 1.0:
            raise ValueError(
                f"balance_rel_threshold: must be >= 1, got {self.balance_rel_threshold}"
            )
        if not 0.0 < self.kv_high_water <= 1.0:
            raise ValueError(f"kv_high_water: must be in (0, 1], got {self.kv_high_water}")
        for name in ("tokens_per_block", "chars_per_block", "blocks_per_worker"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")


DEFAULT_ROUTING = RoutingSettings()


class NoWorkerError(RuntimeError):
    """No worker is healthy (or none is known)."""


@dataclass
class WorkerState:
    """One worker as the policy sees it (``CacheAwarePolicy.workers`` returns copies)."""

    name: str
    healthy: bool = True
    in_flight: int = 0  # requests routed here and not finished
    other_requests: int = 0  # requests it reported beyond those (sent by someone else)
    kv_usage: float | None = None  # fraction of its KV blocks in use, when reported
    routed: int = 0  # requests routed here, ever
    routed_by_prefix: int = 0  # of which for the prefix it holds
    cached_blocks: int = 0  # block hashes in its prefix view

    @property
    def load(self) -> int:
        return self.in_flight + self.other_requests


@dataclass(frozen=True)
class Route:
    """Where a request goes, and why."""

    worker: str
    cached_blocks: int  # leading blocks of the prompt the worker is believed to hold
    prompt_blocks: int  # the prompt's full blocks
    by_prefix: bool  # chosen for its cached prefix (else for its load)


@dataclass
class _Worker:
    state: WorkerState
    index: PrefixIndex = field(repr=False)
    share: int = 0  # requests routed here, for ties; set level with the others on joining


class CacheAwarePolicy:
    """Picks a worker per request (``choose``) and counts its requests in flight until
    ``finish``. Thread-safe; workers come and go (``add_worker``, ``remove_worker``) and
    leave or rejoin rotation (``set_healthy``) at any time."""

    def __init__(self, settings: RoutingSettings = DEFAULT_ROUTING) -> None:
        self.settings = settings
        self._workers: dict[str, _Worker] = {}
        self._lock = threading.Lock()

    # --- the workers ---------------------------------------------------------------------
    def add_worker(self, name: str, *, healthy: bool = True) -> None:
        with self._lock:
            if name in self._workers:
                raise ValueError(f"worker: {name!r} is already known")
            index = PrefixIndex(self.settings.blocks_per_worker)
            self._workers[name] = _Worker(
                WorkerState(name, healthy=healthy), index, share=self._least_share()
            )

    def remove_worker(self, name: str) -> None:
        with self._lock:
            if self._workers.pop(name, None) is None:
                raise ValueError(f"worker: {name!r} is not known")

    def set_healthy(self, name: str, healthy: bool) -> bool:
        """Put the worker in or out of rotation; True if that changed its state. A worker
        that rejoins starts with an empty prefix view: it may have restarted."""
        with self._lock:
            worker = self._workers.get(name)
            if worker is None or worker.state.healthy == healthy:
                return False
            if healthy:
                worker.index.clear()
                worker.share = self._least_share()
            worker.state.healthy = healthy
            return True

    def report_load(
        self, name: str, *, other_requests: int = 0, kv_usage: float | None = None
    ) -> None:
        """What the worker says of itself: requests it runs that the policy did not send it,
        and how full its KV cache is."""
        with self._lock:
            worker = self._workers.get(name)
            if worker is not None:
                worker.state.other_requests = max(0, other_requests)
                worker.state.kv_usage = kv_usage

    def workers(self) -> list[WorkerState]:
        """A copy of every worker's state, in the order they were added."""
        with self._lock:
            return [replace(w.state, cached_blocks=len(w.index)) for w in self._workers.values()]

    # --- routing -------------------------------------------------------------------------
    def choose(self, key: RoutingKey) -> Route:
        """The worker for a prompt (token ids or text; empty: by load alone), counted in
        flight there until ``finish``. ``NoWorkerError`` when no worker is healthy."""
        settings = self.settings
        hashes = block_hashes(key, settings.tokens_per_block, settings.chars_per_block)
        with self._lock:
            candidates = [w for w in self._workers.values() if w.state.healthy]
            if not candidates:
                raise NoWorkerError("no healthy worker to serve the request")
            matched = {id(w): w.index.match(hashes) for w in candidates}
            overloaded = self._overloaded(candidates)
            best = max(candidates, key=lambda w: (matched[id(w)], -w.state.load, -w.share))
            cached = matched[id(best)]
            by_prefix = (
                cached > 0
                and cached >= settings.cache_threshold * len(hashes)
                and id(best) not in overloaded
            )
            if not by_prefix:
                best = min(
                    candidates,
                    key=lambda w: (
                        id(w) in overloaded,
                        w.state.load,
                        w.state.kv_usage or 0.0,
                        -matched[id(w)],
                        w.share,
                    ),
                )
                cached = matched[id(best)]
            best.share += 1
            state = best.state
            state.in_flight += 1
            state.routed += 1
            state.routed_by_prefix += by_prefix
            best.index.insert(hashes)
            return Route(state.name, cached, len(hashes), by_prefix)

    def finish(self, name: str) -> None:
        """A request routed to ``name`` ended (however it ended)."""
        with self._lock:
            worker = self._workers.get(name)
            if worker is not None and worker.state.in_flight > 0:
                worker.state.in_flight -= 1

    def _least_share(self) -> int:
        return min((w.share for w in self._workers.values() if w.state.healthy), default=0)

    def _overloaded(self, candidates: list[_Worker]) -> set[int]:
        """The ``id``s of the candidates overloaded next to the others."""
        settings = self.settings
        least = min(w.state.load for w in candidates)
        full = {
            id(w)
            for w in candidates
            if w.state.kv_usage is not None and w.state.kv_usage >= settings.kv_high_water
        }
        if len(full) == len(candidates):
            full = set()  # all full: the KV cache tells them apart no more
        busy = {
            id(w)
            for w in candidates
            if w.state.load - least > settings.balance_abs_threshold
            and w.state.load > settings.balance_rel_threshold * least
        }
        return busy | full
