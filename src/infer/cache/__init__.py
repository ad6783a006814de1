"""KV cache bookkeeping: block allocator, paged and contiguous pools, prefix index, memory
metrics (no tensors: ``kv_tensors`` is the storage the runner owns)."""

from infer.cache.allocator import BlockAllocator
from infer.cache.paged import PagedKVCachePool
from infer.cache.protocol import CachePoolProtocol
from infer.cache.slotted import SlottedKVCache
from infer.cache.stats import CacheStats

__all__ = [
    "BlockAllocator",
    "CachePoolProtocol",
    "CacheStats",
    "PagedKVCachePool",
    "SlottedKVCache",
]
