"""Stored responses (``store: true``), in memory, at most ``capacity`` of them, least recently used out first.

An entry keeps the response object (``GET /v1/responses/{id}``) and the conversation that
``previous_response_id`` continues: the items of every turn up to and including this response's output. The
item dicts are shared between a chain's entries (each entry holds a new tuple of references), so a long chain
costs one pointer per item per entry, not copies of the items.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from dsa_runtime.server.errors import APIError


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the Response object as it was answered
    conversation: tuple[dict[str, Any], ...]  # input items of every turn and output items, in order


class ResponseStore:
    """Thread-safe LRU map ``response id -> StoredResponse`` (requests are prepared in worker threads)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response_id: str, entry: StoredResponse) -> None:
        if self.capacity < 1:
            return
        with self._lock:
            self._entries[response_id] = entry
            self._entries.move_to_end(response_id)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        """The entry (now the most recently used), or a 404 naming ``param``."""
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is not None:
                self._entries.move_to_end(response_id)
                return entry
        raise self.not_found(response_id, param)

    def delete(self, response_id: str) -> None:
        with self._lock:
            if self._entries.pop(response_id, None) is None:
                raise self.not_found(response_id, None)

    def not_found(self, response_id: str, param: str | None) -> APIError:
        what = "Previous response" if param == "previous_response_id" else "Response"
        return APIError(
            f"{what} with id '{response_id}' not found: it was never stored (store: false), or it is older than "
            f"the {self.capacity} most recently used responses this server keeps (--responses-store-size)",
            status=404, param=param, code="previous_response_not_found" if param else "response_not_found",
        )
