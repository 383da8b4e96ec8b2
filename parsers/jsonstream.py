"""Streaming a model-written JSON object as it is generated, without ever sending bytes that must be undone.

Used for V3/V3.1 arguments, which the model writes as one JSON text. :class:`JsonObjectStream` checks the
syntax character by character and returns only text that every possible continuation keeps: a comma, a
key and its colon are held until their value starts, a number or literal until it ends; string contents go
out as they arrive. When the call ends, :meth:`JsonObjectStream.close` returns what makes the text a valid
object: the closing quote and brackets, after dropping what was held. So the arguments are always valid
JSON: the whole object when the model wrote valid JSON, else the members completed before the first error.

Whitespace between tokens is dropped; everything before the first ``{`` (a ```` ```json ```` fence line) and
everything after the object (the closing fence) is ignored. Raw control characters inside strings, which
models sometimes write, are escaped rather than treated as errors.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_LITERALS = ("true", "false", "null")
_SCALAR_CHARS = frozenset("0123456789+-.eEtruefalsn")
_PLAIN_RUN = re.compile(r'[^"\\\x00-\x1f]+')  # string characters that need no attention
_SIMPLE_ESCAPES = frozenset('"\\/bfnrt')
_HEX = frozenset("0123456789abcdefABCDEF")

# States
_SEEK, _KEY_OR_END, _KEY, _COLON, _VALUE, _VALUE_OR_END, _STRING, _SCALAR, _AFTER, _DONE = range(10)


class JsonObjectStream:
    """Incremental validator and emitter of one JSON object (see the module docstring)."""

    def __init__(self) -> None:
        self._state = _SEEK
        self._stack: list[str] = []  # open containers, as the characters that close them
        self._held = ""  # text that goes out only once the value after it starts
        self._token = ""  # a scalar being read, or a pending string escape
        self._in_key = False  # the string being read is a key (held), not a value (sent)
        self._open_string = False  # a value string's opening quote went out, its closing one not yet

    @property
    def complete(self) -> bool:
        """The model closed the object (a syntax error leaves it open until :meth:`close`)."""
        return self._state == _DONE and not self._stack

    def feed(self, text: str) -> str:
        """Read more of the JSON text; return what can be sent now."""
        out: list[str] = []
        i, n = 0, len(text)
        while i < n and self._state != _DONE:
            if self._state == _STRING and not self._token:
                run = _PLAIN_RUN.match(text, i)
                if run is not None:  # ordinary string characters, in one piece
                    self._string_piece(run.group(), out)
                    i = run.end()
                    continue
            self._step(text[i], out)
            i += 1
        return "".join(out)

    def close(self) -> str:
        """The text that completes what was sent into a valid JSON object."""
        if self._state == _SEEK:
            return "{}"
        out = []
        if self._state == _SCALAR and self._scalar_ok():
            out.append(self._held + self._token)  # a number that ended with the text
        if self._open_string:
            out.append('"')
        out.extend(reversed(self._stack))
        self._state, self._stack, self._open_string = _DONE, [], False
        return "".join(out)

    # -- one character ------------------------------------------------------------------------------------
    def _step(self, c: str, out: list[str]) -> None:
        state = self._state
        if state == _STRING:
            self._string_char(c, out)
        elif state == _SCALAR:
            if c in _SCALAR_CHARS:
                self._token += c
            elif self._scalar_ok():
                out.append(self._held + self._token)
                self._held, self._token, self._state = "", "", _AFTER
                self._step(c, out)  # the character that ended the scalar
            else:
                self._fail()
        elif c.isspace():
            return
        elif state == _SEEK:
            if c == "{":
                out.append("{")
                self._stack.append("}")
                self._state = _KEY_OR_END
        elif state in (_KEY_OR_END, _KEY):
            if c == '"':
                self._held += c
                self._state, self._in_key = _STRING, True
            elif c == "}":
                self._close_container(c, out)
            else:
                self._fail()
        elif state == _COLON:
            if c == ":":
                self._held += c
                self._state = _VALUE
            else:
                self._fail()
        elif state in (_VALUE, _VALUE_OR_END):
            self._value_start(c, out)
        elif c == ",":  # _AFTER a value
            self._held = c
            self._state = _KEY if self._stack[-1] == "}" else _VALUE_OR_END
        elif c in "}]":
            self._close_container(c, out)
        else:
            self._fail()

    def _value_start(self, c: str, out: list[str]) -> None:
        if c == '"':
            out.append(self._held + c)
            self._held, self._state, self._in_key, self._open_string = "", _STRING, False, True
        elif c in "{[":
            out.append(self._held + c)
            self._held = ""
            self._stack.append("}" if c == "{" else "]")
            self._state = _KEY_OR_END if c == "{" else _VALUE_OR_END
        elif c in "-0123456789tfn":
            self._state, self._token = _SCALAR, c
        elif c == "]" and self._state == _VALUE_OR_END:
            self._close_container(c, out)
        else:
            self._fail()

    def _string_char(self, c: str, out: list[str]) -> None:
        if self._token:  # inside an escape: backslash + letter, or backslash + u + four hex digits
            self._token += c
            if self._token[1] == "u":
                if len(self._token) > 2 and c not in _HEX:
                    self._fail()
                elif len(self._token) == 6:
                    self._string_piece(self._token, out)
                    self._token = ""
            elif self._token[1] in _SIMPLE_ESCAPES:
                self._string_piece(self._token, out)
                self._token = ""
            else:
                self._fail()
        elif c == "\\":
            self._token = c
        elif c == '"':
            if self._in_key:
                self._held += c
                self._state = _COLON
            else:
                out.append(c)
                self._state, self._open_string = _AFTER, False
        else:
            self._string_piece(c if c >= " " else f"\\u{ord(c):04x}", out)  # raw control characters: escaped

    def _string_piece(self, piece: str, out: list[str]) -> None:
        if self._in_key:
            self._held += piece
        else:
            out.append(piece)

    def _close_container(self, c: str, out: list[str]) -> None:
        if not self._stack or self._stack[-1] != c:
            self._fail()
            return
        self._held = ""  # a trailing comma before the bracket is forgiven
        out.append(self._stack.pop())
        self._state = _AFTER if self._stack else _DONE

    def _scalar_ok(self) -> bool:
        return self._token in _LITERALS or _NUMBER.fullmatch(self._token) is not None

    def _fail(self) -> None:
        """A syntax error: read nothing more; :meth:`close` completes what was sent."""
        self._held, self._token, self._state = "", "", _DONE
