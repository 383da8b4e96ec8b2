"""Chat deltas of one completion -> Responses output items, and the typed stream events that build them.

One builder serves both answers: a whole response keeps only :attr:`OutputItems.items`, a stream also sends
the events, so the streamed items are the whole answer's by construction. Items follow the model's text:
a ``reasoning`` item (``rs_``, its text as one ``reasoning_text`` part), a ``message`` (``msg_``, one
``output_text`` part), a ``function_call`` per call (``fc_``, with the parser's ``call_`` id as ``call_id``);
a change of kind closes the open item and opens the next. Each item's events::

    response.output_item.added
      response.content_part.added        (reasoning, message)
      response.reasoning_text.delta | response.output_text.delta | response.function_call_arguments.delta ...
      response.reasoning_text.done  | response.output_text.done  | response.function_call_arguments.done
      response.content_part.done         (reasoning, message)
    response.output_item.done

Events are dicts without ``sequence_number`` (the sender numbers them). An item cut off by the token limit
ends with ``status: "incomplete"``, as does a call whose end the parser never saw.
"""

from __future__ import annotations

import secrets
from typing import Any

REASONING, MESSAGE, CALL = "reasoning", "message", "function_call"
_PART = {REASONING: "reasoning_text", MESSAGE: "output_text"}
_PREFIX = {REASONING: "rs", MESSAGE: "msg", CALL: "fc"}


def item_id(kind: str) -> str:
    return f"{_PREFIX[kind]}_{secrets.token_hex(16)}"


class OutputItems:
    """Feeds of chat deltas (:class:`~dsa_runtime.parsers.types.Delta`) -> output items and their events.

    Args:
        stream: the completion's :class:`~dsa_runtime.parsers.stream.StreamParser` (which calls completed).
    """

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._text: list[str] = []  # the open reasoning / message item's text so far
        self._call_index: int | None = None  # the parser's index of the open call

    def feed(self, deltas: list[Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for delta in deltas:
            if delta.reasoning_content:
                self._text_delta(REASONING, delta.reasoning_content, events)
            if delta.content:
                self._text_delta(MESSAGE, delta.content, events)
            for tc in delta.tool_calls:
                if tc.id is not None:
                    self._close("completed", events)
                    self._call_index = tc.index
                    self._add({"id": item_id(CALL), "type": CALL, "status": "in_progress", "arguments": "",
                               "call_id": tc.id, "name": tc.name or ""}, events)
                if tc.arguments and self._open is not None and tc.index == self._call_index:
                    self._open["arguments"] += tc.arguments
                    events.append({"type": "response.function_call_arguments.delta", **self._where(),
                                   "delta": tc.arguments})
        return events

    def finish(self, truncated: bool) -> list[dict[str, Any]]:
        """Close the open item (``incomplete`` when ``truncated``: generation hit the token limit)."""
        events: list[dict[str, Any]] = []
        self._close("incomplete" if truncated else "completed", events)
        return events

    def _where(self, part: bool = False) -> dict[str, Any]:
        where = {"item_id": self._open["id"], "output_index": len(self.items) - 1}
        return {**where, "content_index": 0} if part else where

    def _add(self, item: dict[str, Any], events: list[dict[str, Any]]) -> None:
        self._open = item
        self.items.append(item)
        events.append({"type": "response.output_item.added", "output_index": len(self.items) - 1,
                       "item": dict(item)})

    def _text_delta(self, kind: str, text: str, events: list[dict[str, Any]]) -> None:
        if self._open is None or self._open["type"] != kind:
            self._close("completed", events)
            if kind == REASONING:
                self._add({"id": item_id(kind), "type": kind, "summary": [], "content": [], "status": "in_progress"},
                          events)
            else:
                self._add({"id": item_id(kind), "type": kind, "role": "assistant", "status": "in_progress",
                           "content": []}, events)
            events.append({"type": "response.content_part.added", **self._where(part=True), "part": self._part("")})
        self._text.append(text)
        delta = {"type": f"response.{_PART[kind]}.delta", **self._where(part=True), "delta": text}
        if kind == MESSAGE:
            delta["logprobs"] = []
        events.append(delta)

    def _part(self, text: str) -> dict[str, Any]:
        kind = _PART[self._open["type"]]
        return {"type": kind, "text": text, "annotations": [], "logprobs": []} if kind == "output_text" else {
            "type": kind, "text": text}

    def _close(self, status: str, events: list[dict[str, Any]]) -> None:
        item = self._open
        if item is None:
            return
        if item["type"] == CALL:
            complete = self._call_index in self.stream.completed_calls
            item["status"] = "completed" if complete else "incomplete"
            events.append({"type": "response.function_call_arguments.done", **self._where(),
                           "arguments": item["arguments"]})
        else:
            text = "".join(self._text)
            done = {"type": f"response.{_PART[item['type']]}.done", **self._where(part=True), "text": text}
            if item["type"] == MESSAGE:
                done["logprobs"] = []
            events.append(done)
            events.append({"type": "response.content_part.done", **self._where(part=True), "part": self._part(text)})
            item["content"] = [self._part(text)]
            item["status"] = status
            self._text = []
        events.append({"type": "response.output_item.done", "output_index": len(self.items) - 1, "item": dict(item)})
        self._open, self._call_index = None, None
