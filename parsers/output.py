"""``OutputParser``: the tool-call and reasoning parsers of one request, combined.

>>> parser = OutputParser(tool_parser="deepseekv32", reasoning_parser="deepseek-v3", thinking=True)
>>> message = parser.parse(completion_text)            # doctest: +SKIP
>>> stream = parser.stream()                           # doctest: +SKIP
>>> deltas = stream.feed(chunk)                        # doctest: +SKIP
>>> deltas, finish_reason = stream.finish()            # doctest: +SKIP

``parse`` runs the streaming pipeline over the whole text, so streamed and non-streamed results are the
same by construction (see :mod:`dsa_runtime.parsers.stream`).
"""

from __future__ import annotations

from dsa_runtime.parsers.markers import THINK_END, THINK_START
from dsa_runtime.parsers.plugin import get_reasoning_parser, get_tool_parser
from dsa_runtime.parsers.reasoning import DeepSeekR1ReasoningParser, ReasoningSplitter
from dsa_runtime.parsers.scanner import PlainTextParser, ToolParser
from dsa_runtime.parsers.stream import StreamParser, collect
from dsa_runtime.parsers.types import ParsedOutput

_OFF = (None, "", "none")


class OutputParser:
    """Parses a completion into ``content``, ``reasoning_content`` and OpenAI tool calls.

    Args:
        tool_parser: registered tool parser name or alias (``deepseekv32``, ``deepseekv31``, ``deepseekv3``),
            or ``None``/``"none"`` for no tool parsing.
        reasoning_parser: ``deepseek-r1``, ``deepseek-v3`` or ``None``. With ``thinking=True`` and no reasoning
            parser named, ``deepseek-v3`` is used: the prompt ends in ``<think>``, so without one the reasoning
            and its ``</think>`` would show up as content.
        thinking: the request asked for thinking (``chat_template_kwargs.thinking``).

    Raises:
        dsa_runtime.errors.ConfigError: an unknown parser name (the message lists the valid ones).
    """

    def __init__(
        self,
        tool_parser: str | None = "deepseekv32",
        reasoning_parser: str | None = None,
        thinking: bool = False,
    ) -> None:
        self._tool_cls: type[ToolParser] = (
            PlainTextParser if tool_parser in _OFF else get_tool_parser(tool_parser)  # type: ignore[assignment]
        )
        if reasoning_parser in _OFF:
            reasoning_parser = "deepseek-v3" if thinking else None
        self._reasoning: DeepSeekR1ReasoningParser | None = None
        if reasoning_parser is not None:
            self._reasoning = get_reasoning_parser(reasoning_parser)(thinking=thinking)
        self.thinking = thinking

    @property
    def starts_in_reasoning(self) -> bool:
        return self._reasoning is not None and self._reasoning.starts_in_reasoning

    def stream(self) -> StreamParser:
        """A fresh incremental parser for one streamed completion."""
        reasoning = self.starts_in_reasoning
        # Once reasoning is parsed, a stray <think>/</think> in the visible text is markup, not prose.
        tools = self._tool_cls(drop_tokens=(THINK_START, THINK_END) if reasoning else ())
        return StreamParser(tools, ReasoningSplitter(reasoning, tools.reasoning_stops))

    def parse(self, text: str, truncated: bool = False) -> ParsedOutput:
        """Parse a whole completion. ``truncated``: generation hit the length limit."""
        stream = self.stream()
        deltas = stream.feed(text)
        tail, finish_reason = stream.finish(truncated)
        return collect(deltas + tail, finish_reason, stream.completed_calls)
