"""DeepSeek V3 / V3.1 / R1 special-token tool calls.

V3.1 (also V3.1-Terminus, V3.2-Exp)::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{JSON}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>

V3 (0324) / R1-0528: the word before the separator is the type, the name ends at the newline and the JSON
sits in a fence::

    <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{JSON}\\n```<｜tool▁call▁end｜>

One format reads both call layouts: a head of ``function`` followed by something other than ``{`` is the V3
layout. The name is reported as soon as it is known; the arguments stream as the model writes them,
through :class:`~dsa_runtime.parsers.jsonstream.JsonObjectStream`, which never sends text that a later
character could make invalid, and the call is complete as soon as its object closes. Repeated
``<｜tool▁calls▁begin｜>`` (upstream bug 21) and a call without the block token are accepted; a missing end token
is implied by the next call or block end.
"""

from __future__ import annotations

from dsa_runtime.parsers.jsonstream import JsonObjectStream
from dsa_runtime.parsers.markers import (
    PARTIAL,
    TOOL_CALL_BEGIN,
    TOOL_CALL_END,
    TOOL_CALLS_BEGIN,
    TOOL_CALLS_END,
    TOOL_SEP,
    Partial,
    is_special_fragment,
    match_literal,
)
from dsa_runtime.parsers.scanner import Format, ToolParser
from dsa_runtime.parsers.values import object_json

_TOKENS = (TOOL_CALLS_BEGIN, TOOL_CALLS_END, TOOL_CALL_BEGIN, TOOL_CALL_END, TOOL_SEP)
_BLOCK, _HEAD, _DECIDE, _NAME, _ARGS = "block", "head", "decide", "name", "args"


class TokenFormat(Format):
    """Parses ``<｜tool▁calls▁begin｜>`` blocks into call events."""

    def __init__(self, parser: ToolParser, primary: bool) -> None:
        super().__init__(parser, primary)
        self.state = _BLOCK
        self.head_parts: list[str] = []  # text before <｜tool▁sep｜> (the V3.1 name or the V3 type)
        self.parts: list[str] = []  # the V3 name line
        self.reported = False  # the current call's name went out (a nameless call is read, not reported)
        self.ended = False  # the current call's arguments object closed
        self.json = JsonObjectStream()

    def start(self, buf: str, pos: int) -> int | Partial | None:
        token = match_literal(buf, pos, _TOKENS)
        if token is PARTIAL or token is None:
            return token
        if token == TOOL_CALLS_BEGIN:
            self.parser.block()
            self.state, self.active = _BLOCK, True
        elif token == TOOL_CALL_BEGIN:
            self.parser.block()  # a call without the block token opens an implicit block
            self.active = True
            self._begin_call()
        return pos + len(token)  # other tokens in prose are stray markup: dropped

    def step(self, buf: str, pos: int, final: bool) -> int:
        n = len(buf)
        while pos < n and self.active:
            new = self._block(buf, pos, final) if self.state == _BLOCK else self._call(buf, pos, final)
            if new == pos:
                break
            pos = new
        return pos

    def close(self, truncated: bool) -> None:
        if self.state != _BLOCK and not truncated:
            self._end_call()

    def _block(self, buf: str, pos: int, final: bool) -> int:
        n, i = len(buf), pos
        while i < n and buf[i].isspace():
            i += 1
        if i > pos or i >= n:
            return i
        token = match_literal(buf, i, _TOKENS) if buf[i] == "<" else None
        if token is PARTIAL:
            return n if final else i
        if token is None:
            self.active = False  # prose: the block ended without its end token
            return i
        if token == TOOL_CALL_BEGIN:
            self._begin_call()
        elif token == TOOL_CALLS_END:
            self.active = False
        return i + len(token)

    def _call(self, buf: str, pos: int, final: bool) -> int:
        lt = buf.find("<", pos)
        if lt != pos:
            end = lt if lt >= 0 else len(buf)
            self._text(buf[pos:end])
            return end
        token = match_literal(buf, pos, _TOKENS)
        if token is PARTIAL:
            if not final:
                return pos
            if is_special_fragment(buf[pos:]):
                return len(buf)
            token = None
        if token is None:
            self._text("<")
            return pos + 1
        if token == TOOL_SEP:
            if self.state == _HEAD:
                self._after_sep()
        elif token != TOOL_CALLS_BEGIN:
            self._end_call()
            if token == TOOL_CALL_BEGIN:
                self._begin_call()
            elif token == TOOL_CALLS_END:
                self.active = False
        return pos + len(token)

    def _begin_call(self) -> None:
        self.state, self.head_parts, self.parts, self.reported, self.ended = _HEAD, [], [], False, False

    @property
    def head(self) -> str:
        return "".join(self.head_parts)

    def _after_sep(self) -> None:
        head = self.head.strip()
        if head and head != "function":
            self._named(head)  # V3.1: NAME<｜tool▁sep｜>{...}
        else:
            self.state = _DECIDE  # "function": V3 layout unless the JSON follows directly

    def _named(self, name: str) -> None:
        self.parser.call(name)
        self.reported = True
        self._arguments()

    def _arguments(self) -> None:
        self.state, self.parts, self.json = _ARGS, [], JsonObjectStream()

    def _text(self, text: str) -> None:
        if self.state == _HEAD:
            self.head_parts.append(text)
            return
        if self.state == _DECIDE:
            body = text.lstrip()
            if not body:
                return
            if body[0] == "{":
                head = self.head.strip()
                if head:
                    self._named(head)
                else:
                    self._arguments()  # nameless: arguments read, call not reported
            else:
                self.state = _NAME
            text = body
        if self.state == _NAME:
            newline = text.find("\n")
            if newline < 0:
                self.parts.append(text)
                return
            self.parts.append(text[:newline])
            name = "".join(self.parts).strip()
            if name:
                self._named(name)
            else:
                self._arguments()
            text = text[newline + 1 :]
        piece = self.json.feed(text)
        if self.reported and not self.ended:
            self.parser.args(piece)
            if self.json.complete:
                self.parser.end()  # the object is closed: the call is complete even if its end token never comes
                self.ended = True

    def _end_call(self) -> None:
        """A call's end token (or what implies it): report whatever call the text so far makes."""
        state, text = self.state, "".join(self.parts)
        self.state = _BLOCK
        if state == _HEAD:
            # No separator: "NAME{...}" or a bare "NAME" (zero arguments).
            head = self.head
            brace = head.find("{")
            name = (head if brace < 0 else head[:brace]).strip()
            if name and not any(c.isspace() for c in name):
                self.parser.call(name)
                self.parser.args(object_json(head[brace:]) if brace >= 0 else "{}")
                self.parser.end()
        elif state in (_DECIDE, _NAME):
            name = text.strip() if state == _NAME else self.head.strip()
            if name:
                self.parser.call(name)
                self.parser.args("{}")
                self.parser.end()
        elif state == _ARGS and self.reported and not self.ended:
            self.parser.args(self.json.close())
            self.parser.end()
