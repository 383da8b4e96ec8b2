"""Reasoning parsers: split ``reasoning_content`` from visible text.

``deepseek-r1``: the output is reasoning until ``</think>`` whether or not ``<think>`` was generated (R1 omits
it, R1-0528 emits it); a leading ``<think>`` is stripped; without ``</think>`` everything is reasoning.
``deepseek-v3`` (V3.1/V3.2): the same when the request asked for thinking (the prompt then ends in
``<think>``), otherwise the identity: everything is content.

A tool block that starts while still in reasoning ends the reasoning (the model forgot ``</think>``; upstream
bug 1): its marker goes on to the tool parser and the reasoning loses its trailing whitespace, as content
does before a block. Text after ``</think>`` is kept verbatim.
"""

from __future__ import annotations

from typing import ClassVar

from dsa_runtime.parsers.markers import (
    PARTIAL,
    THINK_END,
    THINK_START,
    is_special_fragment,
    match_literal,
)
from dsa_runtime.parsers.spacing import TrailingSpace

REASONING = "reasoning"
NORMAL = "normal"


class ReasoningSplitter:
    """Streaming router: pieces of text go to ``REASONING`` or ``NORMAL`` (which the tool parser reads).

    Args:
        in_reasoning: whether the output starts inside reasoning.
        stops: tool-block starts that end reasoning (they stay in the normal text).
    """

    def __init__(self, in_reasoning: bool, stops: tuple[str, ...] = ()) -> None:
        self.in_reasoning = in_reasoning
        self._literals = (THINK_END, THINK_START, *stops)
        self._buf = ""
        self._space = TrailingSpace()  # the reasoning's trailing whitespace: dropped if a tool block follows
        self._said = False  # some non-whitespace reasoning went out

    def feed(self, text: str) -> list[tuple[str, str]]:
        return self._run(text, final=False)

    def finish(self) -> list[tuple[str, str]]:
        out = self._run("", final=True)
        if self.in_reasoning:
            self._release(out)
        return out

    def _run(self, text: str, final: bool) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        buf, pos = self._buf + text, 0
        while self.in_reasoning and pos < len(buf):
            lt = buf.find("<", pos)
            if lt < 0:
                self._say(out, buf[pos:])
                pos = len(buf)
                break
            self._say(out, buf[pos:lt])
            pos = lt
            found = match_literal(buf, pos, self._literals)
            if found is PARTIAL:
                if not final:
                    break
                if is_special_fragment(buf[pos:]):
                    self._space.drop()  # a cut-off tool marker: as if the block had started
                    pos = len(buf)
                    break
                found = None
            if found is None:
                self._say(out, "<")
                pos += 1
            elif found == THINK_START:
                if not self._said:
                    self._space.drop()  # whitespace before the opening tag is not reasoning
                pos += len(found)
            elif found == THINK_END:
                self._release(out)
                self.in_reasoning = False
                pos += len(found)
            else:
                self._space.drop()
                self.in_reasoning = False  # a tool block starts: the marker stays for the tool parser
        if not self.in_reasoning and pos < len(buf):
            out.append((NORMAL, buf[pos:]))
            pos = len(buf)
        self._buf = buf[pos:]
        return out

    def _say(self, out: list[tuple[str, str]], text: str) -> None:
        body = self._space.push(text)
        if body:
            out.append((REASONING, body))
            self._said = True

    def _release(self, out: list[tuple[str, str]]) -> None:
        held = self._space.take()
        if held:
            out.append((REASONING, held))


class DeepSeekR1ReasoningParser:
    """``deepseek-r1``: reasoning until ``</think>``, always (the ``thinking`` flag is accepted and ignored)."""

    name: ClassVar[str] = "deepseek-r1"

    def __init__(self, thinking: bool = True) -> None:
        self.thinking = thinking

    @property
    def starts_in_reasoning(self) -> bool:
        return True

    def splitter(self, stops: tuple[str, ...] = ()) -> ReasoningSplitter:
        """A fresh streaming splitter for one request."""
        return ReasoningSplitter(self.starts_in_reasoning, stops)

    def parse(self, text: str) -> tuple[str | None, str | None]:
        """Non-streaming split of a whole completion: ``(reasoning_content, content)``, ``None`` when empty."""
        splitter = self.splitter()
        parts = splitter.feed(text) + splitter.finish()
        reasoning = "".join(t for channel, t in parts if channel == REASONING)
        content = "".join(t for channel, t in parts if channel == NORMAL)
        return reasoning or None, content or None


class DeepSeekV3ReasoningParser(DeepSeekR1ReasoningParser):
    """``deepseek-v3``: R1 semantics when thinking was requested, else everything is content."""

    name: ClassVar[str] = "deepseek-v3"

    def __init__(self, thinking: bool = False) -> None:
        super().__init__(thinking)

    @property
    def starts_in_reasoning(self) -> bool:
        return self.thinking
