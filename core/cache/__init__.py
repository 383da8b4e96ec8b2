"""Paged KV caches: per-layer MLA and index-K pools, the page allocator and the memory planner.

Public API: :class:`KVCache`, :class:`PageAllocator`, :func:`plan_capacity` / :class:`CachePlan`,
:func:`device_budget_bytes`.
"""

from dsa_runtime.cache.allocator import PageAllocator
from dsa_runtime.cache.kv_cache import KVCache, mla_bytes_per_token
from dsa_runtime.cache.planner import CachePlan, device_budget_bytes, plan_capacity

__all__ = [
    "CachePlan",
    "KVCache",
    "PageAllocator",
    "device_budget_bytes",
    "mla_bytes_per_token",
    "plan_capacity",
]
