"""Prefix cache: a radix tree over full KV pages, so requests that share a prompt prefix share its pages.

Each node is one full page: its key is the ``page_size`` token ids the page holds, its path from the root the
tokens before them, and its value the physical page id. The MLA rows and the index-K rows of a token live at the
same page id, so one match serves both caches. A page's rows depend only on the tokens up to its end, so a
request whose prompt starts with a node's path can take the page instead of computing it.

* :meth:`RadixCache.match` finds the longest cached run of full pages that a request's tokens start with
  (leaving at least one token to compute, whose logits give the next token), and takes a reference on it.
* :meth:`RadixCache.insert` gives the tree a running request's computed full pages once its prompt is in the
  cache; the request keeps references on that path while it runs. A page whose tokens are already cached under
  the same path stays the request's own (freed with it); any other becomes a node.
* :meth:`RadixCache.release` (finish, abort, preemption) inserts the request's computed full pages the same
  way, drops its references and frees the pages the tree did not take.
* Nodes nobody references stay cached and are *evictable*: :meth:`RadixCache.evict` frees the least recently
  used leaves when the allocator runs short. A referenced node's ancestors are referenced too (references are
  taken along whole root paths), so every unreferenced node can be evicted, leaves first.

The tree owns its pages in the allocator's eyes (they stay allocated); the engine's free page count for
admission is ``allocator.num_free + cache.evictable``, so the cache never refuses a request that would fit
without it.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class _Node:
    key: tuple[int, ...]
    page: int
    parent: _Node | None
    children: dict[tuple[int, ...], _Node] = field(default_factory=dict)
    refs: int = 0
    last_use: int = 0


class RadixCache:
    """The prefix tree of one scheduler (each DP group has its own). See the module docstring.

    Args:
        allocator: the page allocator (``alloc``, ``free``, ``num_free``); evicted pages go back to it.
        page_size: tokens per page.
    """

    def __init__(self, allocator: Any, page_size: int) -> None:
        self.allocator = allocator
        self.page_size = page_size
        self.root = _Node((), 0, None)
        self._clock = itertools.count(1)
        self.num_nodes = 0
        self.evictable = 0  # nodes with no reference (all of them can be evicted, leaves first)
        self.hit_tokens = 0
        self.query_tokens = 0
        self.evicted_pages = 0

    # --- lookup ---------------------------------------------------------------------------------------------
    def match(self, token_ids: list[int]) -> list[_Node]:
        """The cached path of full pages that ``token_ids`` starts with, at most ``(len - 1) // page_size`` pages
        (one token is always left to compute), referenced for the caller."""
        ps = self.page_size
        limit = (len(token_ids) - 1) // ps
        path: list[_Node] = []
        node = self.root
        now = next(self._clock)
        for i in range(limit):
            child = node.children.get(tuple(token_ids[i * ps:(i + 1) * ps]))
            if child is None:
                break
            child.last_use = now
            path.append(child)
            node = child
        self._acquire(path)
        return path

    def count_lookup(self, prompt_tokens: int, cached_tokens: int) -> None:
        """Count an admitted request's lookup in the hit rate (a request that waits is counted once, when it runs)."""
        self.query_tokens += prompt_tokens
        self.hit_tokens += cached_tokens

    # --- ownership ------------------------------------------------------------------------------------------
    def insert(self, token_ids: list[int], pages: list[int], num_computed: int, held: list[_Node]) -> list[_Node]:
        """A running request gives the tree its computed full pages (those ``num_computed`` tokens cover) and
        references the whole path from then on instead of ``held``; returns that path."""
        path = self._insert_path(token_ids, pages, num_computed)
        self._acquire(path)
        self._release(held)
        return path

    def release(self, token_ids: list[int], pages: list[int], num_computed: int, held: list[_Node]) -> None:
        """A request is done with ``pages``: its computed full pages go into the tree, its references (``held``)
        are dropped, and every page no node holds is freed (a page the tree already held under the same tokens
        is the request's own duplicate)."""
        path = self._insert_path(token_ids, pages, num_computed)
        self._release(held)
        owned = {node.page for node, page in zip(path, pages, strict=False) if node.page == page}
        self.allocator.free([p for p in pages if p not in owned])

    def _insert_path(self, token_ids: list[int], pages: list[int], num_computed: int) -> list[_Node]:
        """The tree path of the request's computed full pages, adding a node (its page) where none exists."""
        ps = self.page_size
        # Under overlap scheduling num_computed counts an in-flight token the host has not appended yet.
        full = min(min(num_computed, len(token_ids)) // ps, len(pages))
        node = self.root
        now = next(self._clock)
        path: list[_Node] = []
        for i in range(full):
            key = tuple(token_ids[i * ps:(i + 1) * ps])
            child = node.children.get(key)
            if child is None:
                child = _Node(key, pages[i], node)
                node.children[key] = child
                self.num_nodes += 1
                self.evictable += 1
            child.last_use = now
            path.append(child)
            node = child
        return path

    def _acquire(self, path: list[_Node]) -> None:
        for node in path:
            if node.refs == 0:
                self.evictable -= 1
            node.refs += 1

    def _release(self, path: list[_Node]) -> None:
        for node in path:
            node.refs -= 1
            if node.refs == 0:
                self.evictable += 1
            elif node.refs < 0:
                raise RuntimeError("prefix cache: a node was released more often than it was referenced")

    # --- eviction -------------------------------------------------------------------------------------------
    def evict(self, num_pages: int) -> int:
        """Free up to ``num_pages`` unreferenced pages, least recently used leaves first; returns how many."""
        if num_pages <= 0 or self.evictable == 0:
            return 0
        heap = [(n.last_use, id(n), n) for n in self._leaves() if n.refs == 0]
        heapq.heapify(heap)
        freed: list[int] = []
        while heap and len(freed) < num_pages:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            del parent.children[node.key]
            freed.append(node.page)
            self.num_nodes -= 1
            self.evictable -= 1
            if parent is not self.root and not parent.children and parent.refs == 0:
                heapq.heappush(heap, (parent.last_use, id(parent), parent))
        self.allocator.free(freed)
        self.evicted_pages += len(freed)
        return len(freed)

    def _leaves(self) -> list[_Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self.root:
                out.append(node)
        return out
