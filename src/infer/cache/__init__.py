"""KV cache: block allocator, paged and contiguous pools, prefix index, memory metrics."""

from infer.cache.allocator import BlockAllocator
from infer.cache.paged import PagedKVCachePool
from infer.cache.protocol import CachePoolProtocol, KVCacheProtocol
from infer.cache.slotted import SlottedKVCache
from infer.cache.stats import CacheStats

__all__ = [
    "BlockAllocator",
    "CachePoolProtocol",
    "CacheStats",
    "KVCacheProtocol",
    "PagedKVCachePool",
    "SlottedKVCache",
]
