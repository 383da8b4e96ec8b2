"""Page allocator of the paged KV cache: a free list of physical page ids, page 0 reserved.

Page 0 is never handed out, so a zero entry in a padded page table (``block_table`` rows are padded with 0
for kernels) never aliases a live request's data.
"""

from __future__ import annotations


class PageAllocator:
    """Hands out physical pages ``1 .. num_pages - 1``; page 0 is reserved.

    ``alloc(n)`` returns ``n`` distinct page ids, or ``None`` when fewer than ``n`` are free (nothing is taken
    then). ``free(pages)`` returns pages; freeing a page that is not in use raises ``ValueError`` (a double
    free would hand one page to two requests).
    """

    def __init__(self, num_pages: int) -> None:
        if num_pages < 2:
            raise ValueError(f"num_pages must be >= 2 (page 0 is reserved), got {num_pages}")
        self.num_pages = num_pages
        # Pop from the end: low page ids go out first, which keeps small runs compact and easy to read.
        self._free: list[int] = list(range(num_pages - 1, 0, -1))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    @property
    def capacity(self) -> int:
        """Pages that can ever be handed out (``num_pages - 1``)."""
        return self.num_pages - 1

    def can_alloc(self, n: int) -> bool:
        return 0 <= n <= len(self._free)

    def alloc(self, n: int) -> list[int] | None:
        """Take ``n`` free pages (``n >= 0``); ``None`` if not enough are free."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} pages")
        if n > len(self._free):
            return None
        pages = [self._free.pop() for _ in range(n)]
        self._used.update(pages)
        return pages

    def free(self, pages: list[int]) -> None:
        """Return ``pages`` to the free list; every one must be in use (checked before anything changes)."""
        seen: set[int] = set()
        for p in pages:
            if p not in self._used or p in seen:
                raise ValueError(f"page {p} is not in use (double free or foreign page)")
            seen.add(p)
        for p in pages:
            self._used.discard(p)
            self._free.append(p)

    def reset(self) -> None:
        """Free everything (e.g. after a failed step the engine cannot attribute)."""
        self.__init__(self.num_pages)
