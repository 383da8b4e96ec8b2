"""Answers out of text, and the checks that score a reply.

Numbers are compared in one canonical spelling (:func:`canonical`): no thousands commas, no ``$``, no
trailing zeros after the point (``"1,234.50"`` -> ``"1234.5"``, ``"-$7"`` -> ``"-7"``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

# A number: optional minus and $, digits with or without thousands commas, optional decimals. The
# look-behind keeps "3.5" one number and "10-3" two (a hyphen right after a digit is not a sign).
_NUMBER = re.compile(r"(?<![\d.])(-?)\$?((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)")
_BOXED = "\\boxed{"


def canonical(number: str) -> str:
    """``"-1,234.50"`` -> ``"-1234.5"``; raises ValueError if ``number`` is not a number."""
    try:
        value = Decimal(number.replace(",", "").replace("$", ""))
    except InvalidOperation:
        raise ValueError(f"not a number: {number!r}") from None
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def last_number(text: str | None) -> str | None:
    """The last number in ``text`` (canonical), None if there is none."""
    found = _NUMBER.findall((text or "").replace("{,}", ","))  # LaTeX writes 1{,}000
    if not found:
        return None
    sign, digits = found[-1]
    return canonical(sign + digits)


def _last_boxed(text: str) -> str | None:
    """The inside of the last ``\\boxed{...}`` (nested braces allowed), None if there is none or it is open."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, i = 1, start + len(_BOXED)
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def model_answer(text: str | None) -> str | None:
    """A reply's answer: the last number of its last ``\\boxed{}`` if it has one, else its last number."""
    boxed = _last_boxed(text or "")
    return last_number(boxed if boxed is not None else text)


def reference_answer(answer: str | int | float) -> str:
    """A reference's answer: the number after ``####`` (gsm8k's format) or the whole value, canonical.

    Raises ValueError when it holds no number.
    """
    text = str(answer)
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    number = last_number(text)
    if number is None:
        raise ValueError(f"the answer {answer!r} holds no number")
    return number


def check_number(reply: str | None, expected: str) -> tuple[bool, bool, str | None]:
    """``(correct, invalid, extracted)`` of a reply against the canonical ``expected`` number."""
    got = model_answer(reply)
    return got == expected, got is None, got


def check_calls(
    calls: Sequence[tuple[str, str]], expected: Sequence[Mapping[str, Any]]
) -> tuple[bool, bool, list[dict[str, Any]]]:
    """``(correct, invalid, parsed calls)`` of a reply's tool calls ``(name, arguments JSON)``.

    Correct: the same functions with equal arguments, in order. Invalid: no call, or arguments that are not a
    JSON object (the parsed list then holds the raw string for that call).
    """
    parsed: list[dict[str, Any]] = []
    invalid = not calls
    for name, arguments in calls:
        try:
            args = json.loads(arguments)
        except (TypeError, ValueError):
            args = None
        if not isinstance(args, dict):
            invalid, args = True, arguments
        parsed.append({"name": name, "arguments": args})
    want = [{"name": c["name"], "arguments": c["arguments"]} for c in expected]
    return not invalid and parsed == want, invalid, parsed
