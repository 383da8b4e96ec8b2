"""JSON text helpers shared by the tool parsers.

DSML arguments are written in ``json.dumps(..., ensure_ascii=False)`` layout, one serialisation for
streamed fragments and whole messages. Parsing values is strict JSON: ``NaN``/``Infinity`` and numbers that
overflow to infinity are rejected, because re-serialising them would emit invalid JSON.
"""

from __future__ import annotations

import json
import math
from typing import Any

from dsa_runtime.parsers.jsonstream import JsonObjectStream


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number out of range: {text}")
    return value


def loads_strict(text: str) -> Any:
    """``json.loads`` limited to standard JSON; raises ``ValueError`` (or ``RecursionError``) otherwise."""
    return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)


def dumps(value: Any) -> str:
    """The one serialisation used for every argument value: default separators, characters unescaped."""
    return json.dumps(value, ensure_ascii=False)


def escape_fragment(text: str) -> str:
    """JSON-escape a piece of a string value without quotes; escaping is per character, so pieces concatenate."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def typed_value_json(raw: str) -> str:
    """JSON text of a ``string="false"`` (or untyped) parameter value.

    The stripped value parsed as JSON, re-serialised; when it is not valid JSON the stripped raw text becomes a
    JSON string instead (the official decoder would pass invalid JSON through and break the arguments).
    """
    text = raw.strip()
    try:
        return dumps(loads_strict(text))
    except (ValueError, RecursionError):
        return dumps(text)


def object_json(raw: str) -> str:
    """Arguments the model wrote as raw JSON text, by the rules of :mod:`dsa_runtime.parsers.jsonstream`.

    A valid object as written (text before the first ``{`` that is whitespace or a fence line, and text after
    the object, ignored); ``{}`` when there is no argument text; otherwise the model's malformed text
    verbatim (trailing whitespace and a closing fence dropped), never a repaired or empty object.
    """
    stream = JsonObjectStream()
    return stream.feed(raw) + stream.close()
