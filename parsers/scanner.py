"""Streaming skeleton shared by the tool-call parsers.

A :class:`ToolParser` reads the visible-text channel of a completion piece by piece and reports
:class:`Event` values: prose, "a tool block starts here", call starts, argument fragments, call ends. It is
one left-to-right scan whose decisions depend only on the text, never on where a chunk ended: text that
might still be the start of a marker is held back until the next piece (or the end) decides it. The
non-streaming parse runs the same scan over the whole text, so both always agree.

Prose is everything outside tool blocks. Each wire format (:class:`Format`) recognises where its block
starts and parses the block; a parser lists its formats, the first one being its own (``primary``), the
others accepted only through their unambiguous special-token starts (so a DSML parser also understands a
V3.1-style block a V3.2-Exp model emits, and vice versa; upstream bugs 5 and 6 of docs/parsers.md).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, NamedTuple

from dsa_runtime.parsers.markers import PARTIAL, Partial, is_special_fragment, match_literal

TEXT = "text"  # prose (value: the text)
BLOCK = "block"  # a tool block starts: the prose before it ends there
CALL = "call"  # a call starts (value: the function name)
ARGS = "args"  # a fragment of the current call's arguments JSON
END = "end"  # the current call is complete (its arguments JSON is closed)


class Event(NamedTuple):
    """One step of a tool parser's output."""

    kind: str
    value: str = ""


class Format(ABC):
    """One tool-call wire format inside a :class:`ToolParser`.

    ``start`` looks at a ``<`` in prose; when it recognises a block start it emits the block (and sets
    ``active`` if the block has a body still to read) and returns the index after the marker. ``step``
    reads the body and clears ``active`` where the block ends; it returns the index reached, which it may
    leave unchanged only to wait for more text (or when the block ended on that index). ``close`` is
    called when the stream ends inside a block.
    """

    def __init__(self, parser: ToolParser, primary: bool) -> None:
        self.parser = parser
        self.primary = primary
        self.active = False

    @abstractmethod
    def start(self, buf: str, pos: int) -> int | Partial | None:
        """At a ``<`` in prose: the index after a recognised start (or stray markup), PARTIAL or None."""

    @abstractmethod
    def step(self, buf: str, pos: int, final: bool) -> int:
        """Read the block body from ``pos``; ``final``: no more text will come."""

    @abstractmethod
    def close(self, truncated: bool) -> None:
        """The stream ended inside the block."""


class ToolParser:
    """Base of the tool-call parsers: prose scanning, hold-back, event collection.

    Args:
        drop_tokens: literal tokens removed from prose (``<think>``/``</think>`` once reasoning is parsed,
            so that a stray one never shows as text).
    """

    name: ClassVar[str] = "none"
    formats: ClassVar[tuple[type[Format], ...]] = ()
    # Markers that end reasoning when a tool block starts inside it (see reasoning.ReasoningSplitter).
    reasoning_stops: ClassVar[tuple[str, ...]] = ()

    def __init__(self, drop_tokens: tuple[str, ...] = ()) -> None:
        self._drop = drop_tokens
        self._formats = [cls(self, primary=i == 0) for i, cls in enumerate(self.formats)]
        self._active: Format | None = None
        self._buf = ""
        self._events: list[Event] = []
        self._done = False

    # -- event helpers for formats ------------------------------------------------------------------
    def text(self, text: str) -> None:
        if text:
            self._events.append(Event(TEXT, text))

    def block(self) -> None:
        self._events.append(Event(BLOCK))

    def call(self, name: str) -> None:
        self._events.append(Event(CALL, name))

    def args(self, fragment: str) -> None:
        if fragment:
            self._events.append(Event(ARGS, fragment))

    def end(self) -> None:
        self._events.append(Event(END))

    # -- driving ------------------------------------------------------------------------------------
    def feed(self, text: str) -> list[Event]:
        """Read the next piece of visible text; return the events it completes."""
        if self._done:
            raise RuntimeError("feed() after finish()")
        self._buf += text
        self._run(final=False)
        return self._take()

    def finish(self, truncated: bool = False) -> list[Event]:
        """The stream ended: decide held text; close an open call unless the output was truncated.

        A call cut off by ``truncated`` never gets its END event (its arguments JSON stays open), which is how
        consumers recognise and drop a half call.
        """
        if self._done:
            return []
        self._run(final=True)
        if self._active is not None:
            self._active.close(truncated)
            self._active.active = False
            self._active = None
        self._done = True
        return self._take()

    def _take(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def _run(self, final: bool) -> None:
        buf, pos, n = self._buf, 0, len(self._buf)
        while pos < n:
            if self._active is not None:
                pos = self._active.step(buf, pos, final)
                if self._active.active:
                    break  # waiting for more text inside the block
                self._active = None
                continue
            lt = buf.find("<", pos)
            if lt < 0:
                self.text(buf[pos:])
                pos = n
                break
            self.text(buf[pos:lt])
            pos = lt
            found = self._match_prose(buf, pos)
            if found is PARTIAL:
                if not final:
                    break
                if is_special_fragment(buf[pos:]):
                    # A cut-off special token at the very end is markup: drop it, and the whitespace before it
                    # with it, as a block start would.
                    self.block()
                    pos = n
                    break
                found = None
            if found is None:
                self.text("<")
                pos += 1
            else:
                pos = found
        self._buf = buf[pos:]

    def _match_prose(self, buf: str, pos: int) -> int | Partial | None:
        """At a ``<`` in prose: index after a dropped token or block start, PARTIAL, or None (plain text)."""
        dropped = match_literal(buf, pos, self._drop)
        if isinstance(dropped, str):
            return pos + len(dropped)
        partial = dropped is PARTIAL
        for fmt in self._formats:
            found = fmt.start(buf, pos)
            if found is PARTIAL:
                partial = True
            elif found is not None:
                if fmt.active:
                    self._active = fmt
                return found
        return PARTIAL if partial else None


class PlainTextParser(ToolParser):
    """No tool parsing: all visible text is prose (``--tool-parser none``)."""
