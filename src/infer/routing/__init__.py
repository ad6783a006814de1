"""Cache-aware routing: which of several workers (data-parallel replicas, ``infer serve``
instances behind ``infer router``) should serve a request.

Torch-free and free of HTTP, so that an in-process dispatcher and the router share it.
``CacheAwarePolicy`` sends a request to the worker most likely to hold its prompt's prefix
in its KV cache, unless that worker is overloaded next to the others.
"""

from infer.routing.policy import (
    DEFAULT_ROUTING,
    CacheAwarePolicy,
    NoWorkerError,
    Route,
    RoutingSettings,
    WorkerState,
)
from infer.routing.prefix_blocks import RoutingKey, block_hashes
from infer.routing.prefix_index import PrefixIndex

__all__ = [
    "DEFAULT_ROUTING",
    "CacheAwarePolicy",
    "NoWorkerError",
    "PrefixIndex",
    "Route",
    "RoutingKey",
    "RoutingSettings",
    "WorkerState",
    "block_hashes",
]
