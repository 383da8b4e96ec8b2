"""Streaming a model-written JSON object as it is generated, without ever sending bytes that must be undone.

Used for V3/V3.1 arguments (and a raw-JSON DSML invoke body), which the model writes as one JSON text.
:class:`JsonObjectStream` checks the syntax character by character and returns only text that every
possible continuation keeps: a comma, a key and its colon are held until their value starts, a number or
literal until it ends, whitespace with the token after it; string contents go out as they arrive.

Valid objects come through as the model wrote them (whitespace included), with two repairs that keep them
valid: raw control characters inside strings are escaped, and a trailing comma before a closing bracket is
dropped. Everything before the first ``{`` that is whitespace or a ```` ```json ```` fence line, and
everything after the object (the closing fence), is ignored.

Malformed arguments are never repaired into a different object (an agent would run the tool with
arguments the model did not write): from the first syntax error on, the rest of the text goes out
verbatim, so the arguments are the model's own text, which a client's ``json.loads`` rejects visibly. The
same holds for text that does not start an object (``["a"]``, prose) and for an object still open when the
call ends (:meth:`JsonObjectStream.close`). Trailing whitespace and a closing fence of malformed text are
dropped. Only a call with no argument text at all (nothing, whitespace, an empty fence) gets ``{}``.
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
_SEEK, _KEY_OR_END, _KEY, _COLON, _VALUE, _VALUE_OR_END, _STRING, _SCALAR, _AFTER, _DONE, _RAW = range(11)
_FENCE_OPEN = re.compile(r"\s*(?:`{1,2}|```[A-Za-z0-9_+-]*[ \t]*\r?\n?)?")  # what may precede the "{"
_FENCE_OPEN_LINE = re.compile(r"\s*```[A-Za-z0-9_+-]*[ \t]*\r?\n")
_JSON_SPACE = frozenset(" \t\r\n")  # only these separate JSON tokens (no other Unicode spaces)
_TAIL = frozenset(" \t\r\n`")  # a trailing run of these in malformed text may be the closing fence


class JsonObjectStream:
    """Incremental validator and emitter of one JSON object (see the module docstring)."""

    def __init__(self) -> None:
        self._state = _SEEK
        self._stack: list[str] = []  # open containers, as the characters that close them
        self._held = ""  # text that goes out only once the value after it starts
        self._token = ""  # a scalar being read, or a pending string escape
        self._in_key = False  # the string being read is a key (held), not a value (sent)
        self._open_string = False  # a value string's opening quote went out, its closing one not yet
        self._pre = ""  # text before the object: whitespace or a fence opener so far
        self._tail = ""  # malformed mode: a trailing run of whitespace / backticks, held
        self._said = False  # some argument text went out

    @property
    def complete(self) -> bool:
        """The model closed a valid object (malformed text never completes before :meth:`close`)."""
        return self._state == _DONE and not self._stack

    @property
    def malformed(self) -> bool:
        """A syntax error was seen: the text goes out verbatim from then on."""
        return self._state == _RAW

    def feed(self, text: str) -> str:
        """Read more of the JSON text; return what can be sent now."""
        out: list[str] = []
        i, n = 0, len(text)
        while i < n and self._state != _DONE:
            if self._state == _RAW:
                self._raw(text[i:], out)
                break
            if self._state == _STRING and not self._token:
                run = _PLAIN_RUN.match(text, i)
                if run is not None:  # ordinary string characters, in one piece
                    self._string_piece(run.group(), out)
                    i = run.end()
                    continue
            self._step(text[i], out)
            i += 1
        piece = "".join(out)
        self._said = self._said or bool(piece)
        return piece

    def close(self) -> str:
        """The rest of the arguments at the end of the call: ``""`` after a valid object, ``{}`` when there was
        no argument text, else (malformed or unfinished) the held text verbatim."""
        state = self._state
        if state == _SEEK and not self._pre.strip():
            out = "{}"
        elif state == _SEEK:
            # A fence opener alone is no argument text either (a V3 call cut right after its fence line).
            out = _strip_fence_close(_FENCE_OPEN_LINE.sub("", self._pre, count=1).lstrip()) or "{}"
        elif state == _RAW:
            # Only fences and whitespace (an empty ```json block) are no argument text either.
            out = _strip_fence_close(self._tail) or ("" if self._said else "{}")
        elif state == _DONE:
            out = ""
        else:  # an object still open: the model's text as it is
            out = (self._held + self._token).rstrip()
        self._state, self._stack, self._open_string = _DONE, [], False
        self._held = self._token = self._tail = ""
        return out

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
                self._fail(c, out)
        elif state == _SEEK:
            self._seek(c, out)
        elif c in _JSON_SPACE:
            self._held += c  # goes out with the next token, so an unfinished text never ends in sent whitespace
        elif state in (_KEY_OR_END, _KEY):
            if c == '"':
                self._held += c
                self._state, self._in_key = _STRING, True
            elif c == "}":
                self._close_container(c, out)
            else:
                self._fail(c, out)
        elif state == _COLON:
            if c == ":":
                self._held += c
                self._state = _VALUE
            else:
                self._fail(c, out)
        elif state in (_VALUE, _VALUE_OR_END):
            self._value_start(c, out)
        elif c == ",":  # _AFTER a value
            self._held += c
            self._state = _KEY if self._stack[-1] == "}" else _VALUE_OR_END
        elif c in "}]":
            self._close_container(c, out)
        else:
            self._fail(c, out)

    def _seek(self, c: str, out: list[str]) -> None:
        """Before the object: a ``{`` opens it; whitespace or a fence opener is skipped; other text is malformed."""
        if c == "{":
            out.append("{")
            self._stack.append("}")
            self._state, self._pre = _KEY_OR_END, ""
            return
        self._pre += c
        if _FENCE_OPEN.fullmatch(self._pre) is None:
            pre, self._pre = self._pre, ""
            self._state = _RAW
            self._raw(_FENCE_OPEN_LINE.sub("", pre, count=1).lstrip(), out)

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
            self._fail(c, out)

    def _string_char(self, c: str, out: list[str]) -> None:
        if self._token:  # inside an escape: backslash + letter, or backslash + u + four hex digits
            self._token += c
            if self._token[1] == "u":
                if len(self._token) > 2 and c not in _HEX:
                    self._fail("", out)
                elif len(self._token) == 6:
                    self._string_piece(self._token, out)
                    self._token = ""
            elif self._token[1] in _SIMPLE_ESCAPES:
                self._string_piece(self._token, out)
                self._token = ""
            else:
                self._fail("", out)
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
            self._fail(c, out)
            return
        # Held here: whitespace and at most one comma, which is dropped (a trailing comma is forgiven).
        out.append(self._held.replace(",", "") + self._stack.pop())
        self._held = ""
        self._state = _AFTER if self._stack else _DONE

    def _scalar_ok(self) -> bool:
        return self._token in _LITERALS or _NUMBER.fullmatch(self._token) is not None

    def _fail(self, c: str, out: list[str]) -> None:
        """A syntax error at ``c``: what was held and the rest of the text go out verbatim from here on."""
        pending = self._held + self._token + c
        self._held, self._token, self._state = "", "", _RAW
        self._raw(pending, out)

    def _raw(self, text: str, out: list[str]) -> None:
        """Malformed mode: text goes out as it is, except a trailing whitespace/backtick run, held."""
        if not text:
            return
        end = len(text)
        while end > 0 and text[end - 1] in _TAIL:
            end -= 1
        if end == 0:
            self._tail += text
            return
        out.append(self._tail + text[:end])
        self._tail = text[end:]


def _strip_fence_close(tail: str) -> str:
    """Held trailing text of malformed arguments, without trailing whitespace and one closing fence."""
    text = tail.rstrip()
    if text.endswith("```"):
        text = text[:-3].rstrip()
    return text
