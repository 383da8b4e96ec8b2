"""Decoding a request body: JSON, nested at most ``MAX_DEPTH`` levels, with no lone UTF-16 surrogates.

Both limits turn client mistakes into a 400 naming the field, where they used to be 500s from deep inside:

- Nesting: ``json.loads`` raises RecursionError past ~1000 levels, and anything recursive downstream (pydantic,
  ``json.dumps`` of tool schemas and arguments into the prompt, Jinja) could fail well before that with the
  request handler's frames already on the stack. No sane request nests more than a few dozen levels.
- Surrogates: JSON may escape a lone surrogate (``"\\ud800"``); Python decodes it into a ``str`` that cannot be
  encoded as UTF-8, so the tokenizer (a TypeError from Rust) or the response's own encoding fails later.

Both checks walk the decoded value only when the raw bytes say they could fail (more brackets than the limit,
a ``\\uD800``-``\\uDFFF`` escape or raw surrogate bytes), so a multi-megabyte prompt costs a few byte scans.
"""

from __future__ import annotations

import json
import re
from typing import Any

from dsa_runtime.server.errors import APIError, bad_request

MAX_DEPTH = 128  # JSON levels; a deep tool schema uses ~2 per schema level, a chat message ~5

# Where a lone surrogate can come from: a \uD800..\uDFFF escape (a valid pair matches too), UTF-8 bytes of a
# surrogate (json.loads decodes with "surrogatepass"), or a UTF-16/32 body (NUL bytes; json.loads takes those).
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]|\x00")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def decode_json(raw: bytes) -> Any:
    """The body as JSON; a 400 for invalid JSON, nesting past ``MAX_DEPTH`` or a lone surrogate in any string."""
    try:
        value = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, and an integer of over 4300 digits
        raise bad_request(f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # the C decoder's own guard, far past MAX_DEPTH
        raise _too_deep(()) from None
    deep = raw.count(b"[") + raw.count(b"{") > MAX_DEPTH
    surrogates = _MAYBE_SURROGATE.search(raw) is not None
    if deep or surrogates:
        check_value(value)
    return value


def check_value(value: Any) -> None:
    """400 if ``value`` nests deeper than ``MAX_DEPTH`` or holds a lone surrogate (in a string or a key).

    Iterative, so checking a deep value cannot itself overflow the stack.
    """
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if _LONE_SURROGATE.search(item):
                raise _lone_surrogate(path)
            continue
        if not isinstance(item, (dict, list)):
            continue
        if len(path) >= MAX_DEPTH:
            raise _too_deep(path)
        pairs = item.items() if isinstance(item, dict) else enumerate(item)
        for key, child in pairs:
            if isinstance(key, str) and _LONE_SURROGATE.search(key):
                raise _lone_surrogate(path, in_key=True)
            if isinstance(child, (str, dict, list)):
                stack.append((child, (*path, key)))


def field_name(path: tuple[Any, ...]) -> str | None:
    """A path as the server's ``param`` (``messages.0.content``), printable even when a key is the problem."""
    if not path:
        return None
    return ".".join(str(p).encode("utf-8", "backslashreplace").decode("utf-8") for p in path)


def _lone_surrogate(path: tuple[Any, ...], *, in_key: bool = False) -> APIError:
    name = field_name(path)
    where = f"'{name}'" if name else "the request body"
    what = "a key" if in_key else "the string"
    return bad_request(
        f"invalid value for {where}: {what} contains a lone UTF-16 surrogate (\\ud800-\\udfff), which is not "
        "valid Unicode text; escape astral characters as a surrogate pair or send them as UTF-8",
        param=name,
    )


def _too_deep(path: tuple[Any, ...]) -> APIError:
    # Name the top-level field only: the full path of a 10,000-level value is 10,000 segments long.
    top = field_name(path[:1])
    where = f" (in '{top}')" if top else ""
    return bad_request(f"request body is nested more than {MAX_DEPTH} levels deep{where}", param=top)
