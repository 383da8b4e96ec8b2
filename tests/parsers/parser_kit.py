"""Helpers for the output-parser tests: DSML / V3.1 / V3 renderers, chunkings, delta checks."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Sequence
from typing import Any

from dsa_runtime.parsers.output import OutputParser
from dsa_runtime.parsers.stream import collect
from dsa_runtime.parsers.types import Delta, ParsedOutput

D = "\uff5cDSML\uff5c"
FC = f"<{D}function_calls>"
FCE = f"</{D}function_calls>"
IE = f"</{D}invoke>"
PE = f"</{D}parameter>"
EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"
CALLS_BEGIN = "<\uff5ctool\u2581calls\u2581begin\uff5c>"
CALLS_END = "<\uff5ctool\u2581calls\u2581end\uff5c>"
CALL_BEGIN = "<\uff5ctool\u2581call\u2581begin\uff5c>"
CALL_END = "<\uff5ctool\u2581call\u2581end\uff5c>"
SEP = "<\uff5ctool\u2581sep\uff5c>"

# Text that must never reach content or reasoning when the input only has markup in the usual places.
MARKUP = ("\uff5cDSML\uff5c", "<\uff5c", "</\uff5c", "<think>", "</think>", "tool\u2581call")
CALL_ID = re.compile(r"call_[0-9a-f]{24}")


def I(name: str) -> str:  # noqa: E743 - one letter keeps the vectors as short as their markup
    return f'<{D}invoke name="{name}">'


def P(key: str, string: str) -> str:
    return f'<{D}parameter name="{key}" string="{string}">'


def dsml_param(key: str, value: Any) -> str:
    """One parameter as the official encoder writes it."""
    if isinstance(value, str):
        return f"{P(key, 'true')}{value}{PE}"
    return f"{P(key, 'false')}{json.dumps(value, ensure_ascii=False)}{PE}"


def dsml_invoke(name: str, args: dict[str, Any]) -> str:
    params = "\n".join(dsml_param(k, v) for k, v in args.items())
    return f"{I(name)}\n{params}\n{IE}"


def dsml_block(calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
    return FC + "\n" + "\n".join(dsml_invoke(n, a) for n, a in calls) + "\n" + FCE


def v31_block(calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
    body = "".join(f"{CALL_BEGIN}{n}{SEP}{json.dumps(a, ensure_ascii=False)}{CALL_END}" for n, a in calls)
    return CALLS_BEGIN + body + CALLS_END


def v3_block(calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
    body = "\n".join(
        f"{CALL_BEGIN}function{SEP}{n}\n```json\n{json.dumps(a, ensure_ascii=False)}\n```{CALL_END}"
        for n, a in calls
    )
    return CALLS_BEGIN + body + CALLS_END


def split_at(text: str, cuts: Iterable[int]) -> list[str]:
    points = sorted({c for c in cuts if 0 < c < len(text)})
    edges = [0, *points, len(text)]
    return [text[a:b] for a, b in zip(edges, edges[1:], strict=False)]


def chunked(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def random_chunks(text: str, seed: int, max_size: int = 9) -> list[str]:
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(text):
        n = rng.randint(1, max_size)
        out.append(text[i : i + n])
        i += n
    return out


def stream(parser: OutputParser, chunks: Sequence[str], truncated: bool = False):
    """Run chunks through a fresh stream; returns (per-feed delta lists, all deltas, ParsedOutput)."""
    s = parser.stream()
    per_feed = [s.feed(c) for c in chunks]
    tail, finish_reason = s.finish(truncated)
    per_feed.append(tail)
    deltas = [d for feed in per_feed for d in feed]
    return per_feed, deltas, collect(deltas, finish_reason, s.completed_calls)


class Verbatim(str):
    """Expected arguments that are the model's malformed text, kept as it is (not a JSON object)."""

    def __repr__(self) -> str:
        return f"Verbatim({str.__repr__(self)})"


def arguments_of(text: str) -> dict[str, Any] | Verbatim:
    """A call's arguments: the JSON object, or :class:`Verbatim` text when they are not one."""
    try:
        value = json.loads(text)
    except ValueError:
        return Verbatim(text)
    return value if isinstance(value, dict) else Verbatim(text)


def summary(out: ParsedOutput) -> tuple:
    """Everything but the ids, arguments as (ordered) parsed JSON or verbatim text."""
    calls = []
    for c in out.tool_calls:
        args = arguments_of(c.arguments)
        calls.append((c.name, args if isinstance(args, Verbatim) else list(args.items()), c.type))
    return out.content, out.reasoning_content, calls, out.finish_reason


def calls_of(out: ParsedOutput) -> list[tuple[str, dict[str, Any] | Verbatim]]:
    return [(c.name, arguments_of(c.arguments)) for c in out.tool_calls]


def check_deltas(deltas: Sequence[Delta], markup: Sequence[str] = MARKUP) -> None:
    """OpenAI delta shapes, call indexes in order, unique ids, no markup in text deltas."""
    seen: dict[int, str] = {}
    for delta in deltas:
        d = delta.to_dict()
        assert d, "empty delta"
        for field in ("content", "reasoning_content"):
            text = d.get(field)
            if text is not None:
                assert text, "empty text delta"
                for m in markup:
                    assert m not in text, (m, text)
        for tc in d.get("tool_calls", []):
            index = tc["index"]
            if index not in seen:
                assert index == len(seen), "call indexes must count up from 0"
                assert set(tc) == {"index", "id", "type", "function"}, tc
                assert tc["type"] == "function" and CALL_ID.fullmatch(tc["id"]), tc
                assert tc["function"]["arguments"] == "" and tc["function"]["name"], tc
                seen[index] = tc["id"]
            else:
                assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}, tc
                assert tc["function"]["arguments"], tc
    assert len(set(seen.values())) == len(seen), "call ids must be unique"


def assert_same_everywhere(
    parser: OutputParser, text: str, truncated: bool = False, seeds: int = 3, markup: Sequence[str] = MARKUP
) -> tuple:
    """Whole-text parse == streamed parse for several chunkings; returns the summary."""
    whole = parser.parse(text, truncated=truncated)
    expected = summary(whole)
    chunkings = [[text], chunked(text, 1), chunked(text, 2), chunked(text, 5)]
    chunkings += [random_chunks(text, seed) for seed in range(seeds)]
    for chunks in chunkings:
        _, deltas, out = stream(parser, chunks, truncated)
        check_deltas(deltas, markup)
        assert summary(out) == expected, chunks
        # Same bytes, not only the same JSON: both come from one serialisation.
        assert [c.arguments for c in out.tool_calls] == [c.arguments for c in whole.tool_calls]
    return expected
