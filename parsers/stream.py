"""The streaming pipeline of one request, and the folding of its deltas back into a message.

Stages, each a left-to-right scan that holds back only what the next text could still change:

1. :class:`EosFilter` removes ``<｜end▁of▁sentence｜>``.
2. :class:`~dsa_runtime.parsers.reasoning.ReasoningSplitter` routes reasoning and visible text.
3. A :class:`~dsa_runtime.parsers.scanner.ToolParser` turns visible text into prose and call events.
4. :class:`ContentFormatter` applies the content rules of docs/parsers.md: text before the first block loses its
   trailing whitespace; each stretch of prose after a block is stripped and joined with ``\\n\\n``.

Because no stage ever decides on where a chunk happens to end, the concatenated deltas are the same for
every chunking, and :func:`collect` of the deltas is what the non-streaming parse returns.
"""

from __future__ import annotations

import json
from collections.abc import Collection

from dsa_runtime.parsers.markers import EOS
from dsa_runtime.parsers.reasoning import REASONING, ReasoningSplitter
from dsa_runtime.parsers.scanner import ARGS, BLOCK, CALL, END, TEXT, Event, ToolParser
from dsa_runtime.parsers.spacing import TrailingSpace
from dsa_runtime.parsers.types import Delta, ParsedOutput, ToolCall, ToolCallDelta, new_call_id


class EosFilter:
    """Drops every end-of-sentence token; holds a suffix that could still become one."""

    def __init__(self) -> None:
        self._held = ""

    def feed(self, text: str) -> str:
        pieces = (self._held + text).split(EOS)
        last = pieces[-1]
        lt = last.rfind("<")  # EOS contains a single "<", so only a suffix from the last one can grow into it
        if lt >= 0 and EOS.startswith(last[lt:]):
            self._held, pieces[-1] = last[lt:], last[:lt]
        else:
            self._held = ""
        return "".join(pieces)

    def finish(self) -> str:
        held, self._held = self._held, ""
        return held


class ContentFormatter:
    """Visible-text whitespace rules around tool blocks (docs/parsers.md); text before any block is verbatim."""

    def __init__(self) -> None:
        self._after_block = False  # a block has been seen: prose stretches are stripped from now on
        self._fresh = False  # nothing of the current post-block stretch went out yet
        self._space = TrailingSpace()
        self._said = False  # some content went out

    def text(self, text: str) -> str:
        body = self._space.push(text)
        if not body:
            return ""
        if self._fresh:
            body = body.lstrip()
            if self._said:
                body = "\n\n" + body
            self._fresh = False
        self._said = True
        return body

    def block(self) -> None:
        self._after_block, self._fresh = True, True
        self._space.drop()

    def finish(self) -> str:
        held = self._space.take()
        if self._after_block:
            return ""  # the last stretch after a block is stripped
        return held


class _Deltas:
    """Builds one ``feed``'s delta list, merging neighbouring text or argument pieces."""

    def __init__(self) -> None:
        self.items: list[Delta] = []

    def content(self, text: str) -> None:
        last = self.items[-1] if self.items else None
        if not text:
            return
        if last is not None and last.content is not None:
            last.content += text
        else:
            self.items.append(Delta(content=text))

    def reasoning(self, text: str) -> None:
        last = self.items[-1] if self.items else None
        if not text:
            return
        if last is not None and last.reasoning_content is not None:
            last.reasoning_content += text
        else:
            self.items.append(Delta(reasoning_content=text))

    def header(self, index: int, call_id: str, name: str) -> None:
        self.items.append(
            Delta(
                tool_calls=[ToolCallDelta(index=index, id=call_id, type="function", name=name, arguments="")]
            )
        )

    def arguments(self, index: int, fragment: str) -> None:
        last = self.items[-1].tool_calls[0] if self.items and self.items[-1].tool_calls else None
        if last is not None and last.index == index and last.id is None and last.arguments is not None:
            last.arguments += fragment  # the header delta keeps its arguments "" as OpenAI clients expect
        else:
            self.items.append(Delta(tool_calls=[ToolCallDelta(index=index, arguments=fragment)]))


class StreamParser:
    """Incremental parser of one completion: ``feed(chunk)`` returns deltas; ``finish()`` flushes.

    Created by :meth:`dsa_runtime.parsers.OutputParser.stream`.
    """

    def __init__(self, tools: ToolParser, splitter: ReasoningSplitter) -> None:
        self._eos = EosFilter()
        self._split = splitter
        self._tools = tools
        self._content = ContentFormatter()
        self._calls = 0  # calls started (their indexes are 0..n-1)
        self._completed = 0
        self._complete: set[int] = set()  # indexes of the calls whose end was seen
        self._arguments: dict[int, list[str]] = {}  # each call's argument text so far
        self._finish_reason: str | None = None

    @property
    def completed_calls(self) -> frozenset[int]:
        """Indexes of the calls that ended (a call cut off by truncation is not among them)."""
        return frozenset(self._complete)

    @property
    def in_reasoning(self) -> bool:
        """Whether the text fed so far ends inside the reasoning (the next text continues it)."""
        return self._split.in_reasoning

    @property
    def parse_errors(self) -> int:
        """Completed calls whose argument text is not a JSON object (kept verbatim; see docs/parsers.md)."""
        return sum(not _is_json_object("".join(self._arguments.get(i, []))) for i in self._complete)

    def feed(self, chunk: str) -> list[Delta]:
        """Parse the next piece of generated text."""
        if self._finish_reason is not None:
            raise RuntimeError("feed() after finish()")
        out = _Deltas()
        self._route(self._split.feed(self._eos.feed(chunk)), out)
        return out.items

    def finish(self, truncated: bool = False) -> tuple[list[Delta], str]:
        """End of generation: flush held text and return ``(deltas, finish_reason)``.

        ``truncated`` means generation stopped at the length limit: a call still open then stays incomplete
        (its arguments are not closed) and does not count; :func:`collect` leaves it out.
        """
        if self._finish_reason is not None:
            return [], self._finish_reason
        out = _Deltas()
        self._route(self._split.feed(self._eos.finish()) + self._split.finish(), out)
        self._apply(self._tools.finish(truncated), out)
        out.content(self._content.finish())
        if self._completed:
            self._finish_reason = "tool_calls"
        else:
            self._finish_reason = "length" if truncated else "stop"
        return out.items, self._finish_reason

    def _route(self, parts: list[tuple[str, str]], out: _Deltas) -> None:
        for channel, text in parts:
            if channel == REASONING:
                out.reasoning(text)
            else:
                self._apply(self._tools.feed(text), out)

    def _apply(self, events: list[Event], out: _Deltas) -> None:
        for kind, value in events:
            if kind == TEXT:
                out.content(self._content.text(value))
            elif kind == BLOCK:
                self._content.block()
            elif kind == CALL:
                out.header(self._calls, new_call_id(), value)
                self._calls += 1
            elif kind == ARGS:
                out.arguments(self._calls - 1, value)
                self._arguments.setdefault(self._calls - 1, []).append(value)
            elif kind == END:
                self._completed += 1
                self._complete.add(self._calls - 1)


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


def collect(
    deltas: list[Delta], finish_reason: str, complete: Collection[int] | None = None
) -> ParsedOutput:
    """Fold streamed deltas into the whole message; calls left incomplete by truncation are dropped.

    ``complete`` is the set of call indexes that ended (:attr:`StreamParser.completed_calls`). Without it, a
    client rebuilding the message from deltas alone keeps the calls whose arguments are a JSON object: an
    incomplete call's never are (its closing brace is the last fragment), but neither are the verbatim
    arguments of a complete call the model wrote as malformed JSON, so those are dropped too.
    """
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, list[str]] = {}
    heads: dict[int, tuple[str, str]] = {}
    for delta in deltas:
        if delta.content:
            content.append(delta.content)
        if delta.reasoning_content:
            reasoning.append(delta.reasoning_content)
        for tc in delta.tool_calls:
            if tc.id is not None:
                heads[tc.index] = (tc.id, tc.name or "")
            calls.setdefault(tc.index, []).append(tc.arguments or "")
    tool_calls = []
    for index in sorted(heads):
        arguments = "".join(calls.get(index, []))
        if index in complete if complete is not None else _is_json_object(arguments):
            call_id, name = heads[index]
            tool_calls.append(ToolCall(id=call_id, name=name, arguments=arguments))
    return ParsedOutput(
        content="".join(content) or None,
        reasoning_content="".join(reasoning) or None,
        tool_calls=tool_calls,
        finish_reason=finish_reason,
    )
