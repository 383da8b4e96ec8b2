"""DSML tag recognition: which tag starts at a ``<``, or whether more text is needed to tell.

Recognised names: ``function_calls`` / ``function_call`` / ``tool_calls`` (a block), ``invoke``,
``parameter``; with the ``｜DSML｜`` prefix or without it. An open tag's attributes must close with ``>`` on
the same line within a bounded length, so deciding "not a tag" never waits for long.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dsa_runtime.parsers.markers import DSML, PARTIAL, Partial

_NAMES = {
    "function_calls": "block",
    "function_call": "block",
    "tool_calls": "block",  # DeepSeek-V4 spelling
    "invoke": "invoke",
    "parameter": "parameter",
}
_MAX_ATTRS = 512  # an open tag's attributes end with ">" within this many characters, or it is not a tag
_MAX_CLOSE_SPACE = 16
_ATTR_RE = re.compile(r"""([A-Za-z_][\w.-]*)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>/]+))""")


@dataclass(frozen=True)
class Tag:
    """A complete DSML (or plain) tag: ``kind`` is ``block``, ``invoke`` or ``parameter``."""

    kind: str
    closing: bool
    self_closing: bool
    dsml: bool
    attrs: dict[str, str]
    end: int


def _attrs(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for m in _ATTR_RE.finditer(text):
        value = next(g for g in m.groups()[1:] if g is not None)
        out.setdefault(m.group(1).lower(), value)
    return out


def match_tag(buf: str, pos: int) -> Tag | Partial | None:
    """The tag starting at ``buf[pos] == "<"``; PARTIAL while the text could still become one."""
    n = len(buf)
    i = pos + 1
    if i >= n:
        return PARTIAL
    closing = buf[i] == "/"
    if closing:
        i += 1
        if i >= n:
            return PARTIAL
    dsml = buf.startswith(DSML, i)
    if dsml:
        i += len(DSML)
    elif n - i < len(DSML) and DSML.startswith(buf[i:]):
        return PARTIAL
    kind, j, partial = None, i, False
    for name, name_kind in _NAMES.items():
        if buf.startswith(name, i):
            j = i + len(name)
            if j >= n:
                partial = True
            elif buf[j] in ">/" or buf[j].isspace():
                kind = name_kind
                break
        elif n - i < len(name) and name.startswith(buf[i:]):
            partial = True
    if kind is None:
        return PARTIAL if partial else None
    if closing:
        k = j
        while k < n and buf[k] in " \t" and k - j < _MAX_CLOSE_SPACE:
            k += 1
        if k >= n:
            return PARTIAL
        return Tag(kind, True, False, dsml, {}, k + 1) if buf[k] == ">" else None
    k, limit = j, j + _MAX_ATTRS
    while k < n and k < limit:
        c = buf[k]
        if c == ">":
            attrs = buf[j:k]
            return Tag(kind, False, attrs.rstrip().endswith("/"), dsml, _attrs(attrs), k + 1)
        if c == "<" or c == "\n":
            return None
        k += 1
    return PARTIAL if k < limit else None


def plain_block_confirmed(buf: str, end: int) -> bool | Partial | None:
    """A plain ``<function_calls>`` opens a block only if an invoke (or the close tag) follows it.

    Without the DSML prefix the tag could be prose about tags ("wrap calls in <function_calls>"), which must
    stay visible; a real block starts with an invoke after at most whitespace.
    """
    i, n = end, len(buf)
    while i < n and buf[i].isspace():
        i += 1
    if i >= n:
        return PARTIAL
    if buf[i] != "<":
        return None
    tag = match_tag(buf, i)
    if tag is PARTIAL:
        return PARTIAL
    if tag is not None and (
        (tag.kind == "invoke" and not tag.closing) or (tag.kind == "block" and tag.closing)
    ):
        return True
    return None
