"""Continuous-batching scheduler: a waiting queue, running requests, pages, and a token budget per step.

Each step:

1. Running requests that are decoding get one token each (oldest first), while the token budget lasts.
2. Running requests that are part-way through their prompt (chunked prefill) get the next chunk.
3. Waiting requests are admitted in arrival order while there is budget, a free running slot, and enough free
   pages for their whole prompt plus the first generated token (a request that does not fit waits; later
   arrivals do not overtake it).

With a prefix cache (:class:`~dsa_runtime.cache.radix.RadixCache`, on unless ``--disable-radix-cache``) an admitted
request first takes the cached full pages its tokens start with and computes only the rest; a request gives the
cache its computed full pages when it is released (finish, abort, preemption: a preempted request then finds
its own prefix again). Cached pages nobody uses count as free: they are evicted, least recently used first,
when an allocation needs them.

Pages are allocated for exactly the tokens scheduled. When a running request needs a page and none is free,
the youngest running request not yet scheduled this step is preempted: its pages are freed and it goes back to
the front of the waiting queue, to be recomputed from its prompt and generated tokens later (its random
numbers depend only on its seed and token count, so a seeded request still produces the same tokens). Nothing is admitted in a step
that preempted. ``max_model_len`` never exceeds the cache's capacity, so a request alone always fits.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from dsa_runtime.cache.radix import RadixCache
from dsa_runtime.engine.request import Request, Status


class Allocator(Protocol):
    num_free: int

    def alloc(self, n: int) -> list[int] | None: ...

    def free(self, pages: list[int]) -> None: ...


@dataclass
class ScheduledSeq:
    """``num_tokens`` tokens of ``request`` starting at cache position ``start``; ``sample`` when they end it."""

    request: Request
    start: int
    num_tokens: int
    sample: bool


class Scheduler:
    """Decides what runs each step and owns the requests' pages.

    Args:
        allocator: page allocator (``num_free``, ``alloc(n)``, ``free(pages)``).
        page_size: tokens per page.
        token_budget: most tokens fed to the model in one step (``--chunked-prefill-size``).
        max_running: most requests holding pages at once (``--max-running-requests``).
        on_release: called with a request whose pages were just freed (finish, abort, preemption).
        prefix_cache: the radix tree of cached pages (None: no prefix caching).
    """

    def __init__(self, allocator: Allocator, page_size: int, token_budget: int, max_running: int,
                 on_release: Callable[[Request], None] | None = None, prefix_cache: RadixCache | None = None) -> None:
        if page_size < 1 or token_budget < 1 or max_running < 1:
            raise ValueError("page_size, token budget and max running requests must all be >= 1")
        self.allocator = allocator
        self.page_size = page_size
        self.token_budget = token_budget
        self.max_running = max_running
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []  # admission order: oldest first
        self.num_preemptions = 0
        self.on_release = on_release
        self.cache = prefix_cache
        # MTP speculation: a decoding request also gets pages for this many draft tokens when they are free
        # (never by preempting another request; without them it drafts fewer).
        self.lookahead = 0
        self.max_model_len: int | None = None  # caps the lookahead (the block table ends there)

    # --- queue management ------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        request.status = Status.WAITING
        self.waiting.append(request)

    def remove(self, request: Request) -> None:
        """Take a request out of the queues and free its pages at once (finish or abort)."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self._release(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # --- the step decision ----------------------------------------------------------------------
    def schedule(self) -> list[ScheduledSeq]:
        budget = self.token_budget
        planned: dict[int, ScheduledSeq] = {}
        preemptions_before = self.num_preemptions
        for request in [r for r in self.running if r.is_decoding]:
            if budget == 0:
                break
            if request.status is not Status.RUNNING:
                continue  # preempted earlier in this loop
            if self.lookahead:
                self._grow(request, min(request.num_computed + 1 + self.lookahead, self.max_model_len or 1 << 62))
            while not self._grow(request, request.num_computed + 1):
                victim = self._victim(request, planned)
                self._preempt(victim or request)
                if victim is None:
                    break
            if request.status is Status.RUNNING:
                planned[id(request)] = ScheduledSeq(request, request.num_computed, 1, True)
                budget -= 1
        for request in [r for r in self.running if not r.is_decoding]:
            if budget == 0:
                break
            if request.status is not Status.RUNNING:
                continue
            n = self._fit_chunk(request, budget, planned)
            if n > 0:
                end = request.num_computed + n
                planned[id(request)] = ScheduledSeq(
                    request, request.num_computed, n, end == len(request.token_ids)
                )
                budget -= n
        if self.num_preemptions == preemptions_before:
            self._admit(budget, planned)
        now = time.monotonic()
        for item in planned.values():
            if item.request.metrics.scheduled is None:
                item.request.metrics.scheduled = now
        return list(planned.values())

    def _fit_chunk(self, request: Request, budget: int, planned: dict[int, ScheduledSeq]) -> int:
        """Tokens of the next prefill chunk that fit; preempts younger unscheduled requests if none do."""
        want = min(request.num_uncomputed, budget)
        while True:
            capacity = (len(request.pages) + self.num_available) * self.page_size - request.num_computed
            n = min(want, capacity)
            if n > 0:
                if not self._grow(request, request.num_computed + n):
                    raise RuntimeError("page allocator refused pages it reported free")
                return n
            victim = self._victim(request, planned)
            if victim is None:
                return 0
            self._preempt(victim)

    def _admit(self, budget: int, planned: dict[int, ScheduledSeq]) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_running:
            request = self.waiting[0]
            total = len(request.token_ids)
            if self.cache is not None and request.num_computed == 0 and not request.pages:
                self._take_cached_prefix(request)
            if self._pages_for(total + 1) - len(request.pages) > self.num_available:
                self._drop_cached_prefix(request)  # a waiting request holds nothing the running ones may need
                break
            if self.cache is not None:
                self.cache.count_lookup(total, request.num_computed)
            n = min(total - request.num_computed, budget)
            self.waiting.popleft()
            request.status = Status.RUNNING
            self.running.append(request)
            if not self._grow(request, request.num_computed + n):
                raise RuntimeError("page allocator refused pages it reported free")
            planned[id(request)] = ScheduledSeq(
                request, request.num_computed, n, request.num_computed + n == total
            )
            budget -= n

    # --- pages ----------------------------------------------------------------------------------
    @property
    def num_available(self) -> int:
        """Pages an allocation can get: free ones plus cached pages nobody references (evicted on demand)."""
        return self.allocator.num_free + (self.cache.evictable if self.cache is not None else 0)

    def take_pages(self, n: int) -> list[int] | None:
        """``n`` pages from the allocator, evicting unreferenced cached pages first when it is short."""
        if n > self.num_available:
            return None
        short = n - self.allocator.num_free
        if short > 0 and self.cache is not None:
            self.cache.evict(short)
        return self.allocator.alloc(n)

    def cache_prompt(self, request: Request) -> None:
        """Give the prefix cache a request's prompt pages once they are computed (its forward is launched, so
        any later step reads them after they are written); the request keeps referencing them."""
        if self.cache is not None:
            request.cache_nodes = self.cache.insert(request.token_ids, request.pages, request.num_computed,
                                                    request.cache_nodes)

    def _take_cached_prefix(self, request: Request) -> None:
        nodes = self.cache.match(request.token_ids)
        request.cache_nodes = nodes
        request.pages = [node.page for node in nodes]
        request.num_computed = len(nodes) * self.page_size
        if request.num_preemptions == 0:
            request.num_cached_tokens = request.num_computed

    def _drop_cached_prefix(self, request: Request) -> None:
        if request.cache_nodes:
            # Every page is the tree's: nothing is inserted or freed, the references are dropped.
            self.cache.release(request.token_ids, request.pages, request.num_computed, request.cache_nodes)
            request.cache_nodes, request.pages, request.num_computed = [], [], 0

    def _pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    def _grow(self, request: Request, tokens: int) -> bool:
        """Make ``request.pages`` cover ``tokens`` positions; False (nothing allocated) when pages are short."""
        need = self._pages_for(tokens) - len(request.pages)
        if need <= 0:
            return True
        if need > self.num_available:
            return False
        pages = self.take_pages(need)
        if not pages or len(pages) != need:
            if pages:
                self.allocator.free(pages)
            return False
        request.pages.extend(pages)
        return True

    def _victim(self, request: Request, planned: dict[int, ScheduledSeq]) -> Request | None:
        """The youngest running request younger than ``request`` and not scheduled this step."""
        position = self.running.index(request)
        for candidate in reversed(self.running[position + 1 :]):
            if id(candidate) not in planned:
                return candidate
        return None

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self._release(request)
        request.num_computed = 0
        request.status = Status.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        # Back to the front: preempted from the youngest up, so the oldest ends up first.
        self.waiting.appendleft(request)

    def _release(self, request: Request) -> None:
        if self.cache is not None:
            self.cache.release(request.token_ids, request.pages, request.num_computed, request.cache_nodes)
            request.cache_nodes = []
            request.pages = []
        elif request.pages:
            self.allocator.free(request.pages)
            request.pages = []
        if self.on_release is not None:
            self.on_release(request)
