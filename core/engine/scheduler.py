"""Continuous-batching scheduler: a waiting queue, running requests, pages, and a token budget per step.

Each step:

1. Running requests that are decoding get one token each (oldest first), while the token budget lasts.
2. Running requests that are part-way through their prompt (chunked prefill) get the next chunk.
3. Waiting requests are admitted in arrival order while there is budget, a free running slot, and enough free
   pages for their whole prompt plus the first generated token (a request that does not fit waits; later
   arrivals do not overtake it).

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
    """

    def __init__(self, allocator: Allocator, page_size: int, token_budget: int, max_running: int,
                 on_release: Callable[[Request], None] | None = None) -> None:
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
            capacity = (len(request.pages) + self.allocator.num_free) * self.page_size - request.num_computed
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
            if self._pages_for(total + 1) > self.allocator.num_free:
                break
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
    def _pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    def _grow(self, request: Request, tokens: int) -> bool:
        """Make ``request.pages`` cover ``tokens`` positions; False (nothing allocated) when pages are short."""
        need = self._pages_for(tokens) - len(request.pages)
        if need <= 0:
            return True
        if need > self.allocator.num_free:
            return False
        pages = self.allocator.alloc(need)
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
        if request.pages:
            self.allocator.free(request.pages)
            request.pages = []
        if self.on_release is not None:
            self.on_release(request)
