"""DeepSeek-V3.2 DSML tool calls: the streaming block parser (tags: :mod:`dsa_runtime.parsers.dsml_tags`).

Canonical shape::

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="NAME">
    <｜DSML｜parameter name="KEY" string="true|false">VALUE</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

Tolerated deviations: tags without the ``｜DSML｜`` prefix or mixed (inside a block; in prose only a plain
``<function_calls>`` opens one), ``tool_calls``/``function_call`` block names, a bare DSML invoke with no
block, a self-closing invoke, raw JSON as the invoke body (kept verbatim when malformed), a parameter without ``string``
(treated like ``string="false"``), missing close tags, several blocks.

Arguments are streamed as JSON text in ``json.dumps`` layout: ``string="true"`` values as they arrive
(JSON-escaped; upstream bug 13), other values whole at their closing tag, because their serialisation depends
on whether the complete value parses as JSON (upstream bug 10). A repeated parameter name keeps its first value:
the first one may already be on the wire.
"""

from __future__ import annotations

from dsa_runtime.parsers.dsml_tags import Tag, match_tag, plain_block_confirmed
from dsa_runtime.parsers.markers import PARTIAL, Partial, is_special_fragment
from dsa_runtime.parsers.scanner import Format, ToolParser
from dsa_runtime.parsers.values import dumps, escape_fragment, object_json, typed_value_json

_BLOCK, _INVOKE, _PARAM, _RAW = "block", "invoke", "param", "raw"


class DsmlFormat(Format):
    """Parses DSML blocks into call events (see the module docstring for the accepted shapes)."""

    def __init__(self, parser: ToolParser, primary: bool) -> None:
        super().__init__(parser, primary)
        self.state = _BLOCK
        self.skip_call = False  # a nameless invoke: read but not reported
        self.args_done = False  # a raw JSON body already produced the whole arguments object
        self.body_started = False  # the invoke body had a parameter or other text (so it is not raw JSON)
        self.keys: set[str] = set()
        self.param_skip = False
        self.param_string: bool = False
        self.parts: list[str] = []

    # -- prose side -----------------------------------------------------------------------------------
    def start(self, buf: str, pos: int) -> int | Partial | None:
        tag = match_tag(buf, pos)
        if tag is PARTIAL or tag is None:
            return tag
        if not (tag.dsml or self.primary):
            return None
        if tag.kind == "block" and not tag.closing:
            if not tag.dsml:
                confirmed = plain_block_confirmed(buf, tag.end)
                if confirmed is not True:
                    return confirmed
            self.parser.block()
            self.state, self.active = _BLOCK, not tag.self_closing
            return tag.end
        if not tag.dsml:
            return None  # other plain tags in prose are prose
        if tag.kind == "invoke" and not tag.closing:
            self.parser.block()  # a bare invoke (V4 style) opens an implicit block
            self.state, self.active = _BLOCK, True
            self._open_invoke(tag)
            return tag.end
        return tag.end  # stray DSML markup outside a block: dropped

    # -- block side -------------------------------------------------------------------------------------
    def step(self, buf: str, pos: int, final: bool) -> int:
        n = len(buf)
        while pos < n and self.active:
            new = (
                self._value(buf, pos, final)
                if self.state in (_PARAM, _RAW)
                else self._between(buf, pos, final)
            )
            if new == pos:
                break
            pos = new
        return pos

    def close(self, truncated: bool) -> None:
        if self.state == _BLOCK or truncated:
            return  # a truncated call stays open: consumers drop it (no half call)
        self._end_invoke()

    def _between(self, buf: str, pos: int, final: bool) -> int:
        """Between invokes or parameters: skip whitespace, handle tags; other text ends the block."""
        n, i = len(buf), pos
        while i < n and buf[i].isspace():
            i += 1
        if i > pos or i >= n:
            return i
        if buf[i] == "<":
            tag = match_tag(buf, i)
            if tag is PARTIAL:
                return n if final else i  # a cut-off tag at the very end of a block is dropped
            if tag is not None:
                self._tag(tag)
                return tag.end
        if self.state == _BLOCK:
            self.active = False  # prose where a tag should be: the block ended without its close tag
            return i
        if buf[i] in "{[" and not self.body_started:
            # "format 2": raw JSON as the invoke body (an array is read too, so that it is kept verbatim as the
            # model's malformed arguments instead of being dropped as stray text).
            self.state, self.parts = _RAW, [buf[i]]
            return i + 1
        # Stray text inside an invoke: not an argument, dropped. Where this skip stops depends on the chunk,
        # so everything it could influence (is the body raw JSON?) is fixed by its first character.
        self.body_started = True
        j = buf.find("<", i + 1)
        return j if j >= 0 else n

    def _tag(self, tag: Tag) -> None:
        inside = self.state == _INVOKE
        if tag.kind == "block":
            if tag.closing:
                if inside:
                    self._end_invoke()
                self.active = False
        elif tag.kind == "invoke":
            if inside:
                self._end_invoke()  # a new invoke or a close tag ends the current one
            if not tag.closing:
                self._open_invoke(tag)
        elif inside and not tag.closing:
            self._open_param(tag)

    def _value(self, buf: str, pos: int, final: bool) -> int:
        """Inside a parameter value or raw JSON body: text up to the tag that ends it."""
        lt = buf.find("<", pos)
        if lt != pos:
            end = lt if lt >= 0 else len(buf)
            self._value_text(buf[pos:end])
            return end
        tag = match_tag(buf, pos)
        if tag is PARTIAL:
            if not final:
                return pos
            if is_special_fragment(buf[pos:]):
                return len(buf)  # cut-off DSML marker at the end: not part of the value
            tag = None
        if tag is not None and self._ends_value(tag):
            self._end_value()
            if not (tag.kind == "parameter" and tag.closing):
                self._tag(tag)  # a structural tag also closed the value it interrupted
            return tag.end
        self._value_text("<")
        return pos + 1

    def _ends_value(self, tag: Tag) -> bool:
        if self.state == _RAW:
            # Only what ends the invoke ends its raw body, so the body's object and the call's end are one step.
            return tag.kind == "invoke" or (tag.kind == "block" and tag.closing)
        # A plain invoke/block tag may be part of a string value; a DSML one never is.
        return (tag.kind == "parameter" and tag.closing) or tag.dsml

    # -- call building ---------------------------------------------------------------------------------
    def _open_invoke(self, tag: Tag) -> None:
        name = tag.attrs.get("name", "").strip()
        self.state, self.skip_call, self.args_done, self.keys = _INVOKE, not name, False, set()
        self.body_started = False
        if name:
            self.parser.call(name)
        if tag.self_closing:
            self._end_invoke()

    def _end_invoke(self) -> None:
        if self.state in (_PARAM, _RAW):
            self._end_value()
        if not self.skip_call:
            if not self.args_done:
                self.parser.args("}" if self.keys else "{}")
            self.parser.end()
        self.state = _BLOCK

    def _open_param(self, tag: Tag) -> None:
        key = tag.attrs.get("name")
        string = tag.attrs.get("string")
        self.param_string = string is not None and string.strip().lower() == "true"
        self.param_skip = self.skip_call or self.args_done or key is None or key in self.keys
        self.state, self.parts, self.body_started = _PARAM, [], True
        if not self.param_skip:
            assert key is not None
            head = ("{" if not self.keys else ", ") + dumps(key) + ": "
            self.keys.add(key)
            self.parser.args(head + '"' if self.param_string else head)
        if tag.self_closing:
            self._end_value()

    def _value_text(self, text: str) -> None:
        if self.state == _PARAM and self.param_skip:
            return
        if self.state == _PARAM and self.param_string:
            self.parser.args(escape_fragment(text))
        else:
            self.parts.append(text)

    def _end_value(self) -> None:
        raw = "".join(self.parts)
        self.parts = []
        if self.state == _RAW:
            if not self.skip_call:
                self.parser.args(object_json(raw))
            self.args_done = True
        elif not self.param_skip:
            self.parser.args('"' if self.param_string else typed_value_json(raw))
        self.state = _INVOKE
