"""Holding back trailing whitespace until the text after it decides whether it is kept."""

from __future__ import annotations


class TrailingSpace:
    """A text stream minus its trailing whitespace, which is held.

    Held whitespace goes out with the next non-whitespace text, or is taken or dropped by the caller (it is
    dropped before a tool block). Pieces are kept in a list so that a model stuck emitting whitespace one
    token at a time costs linear, not quadratic, time.
    """

    def __init__(self) -> None:
        self._held: list[str] = []

    def push(self, text: str) -> str:
        """Add text; return what can go out now (held whitespace included when text follows it)."""
        body = text.rstrip()
        if not body:
            if text:
                self._held.append(text)
            return ""
        out = "".join(self._held) + body
        self._held = [text[len(body) :]] if len(body) < len(text) else []
        return out

    def take(self) -> str:
        """Release the held whitespace."""
        held = "".join(self._held)
        self._held = []
        return held

    def drop(self) -> None:
        self._held = []
