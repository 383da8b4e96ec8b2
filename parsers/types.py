"""Result types of the output parsers, in the shapes of OpenAI chat completions.

``ParsedOutput`` is a whole (non-streaming) assistant message; ``Delta`` is one streaming ``delta`` object.
Both serialise with ``to_dict()``; a delta omits every field it does not carry, as the OpenAI stream does.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any


def new_call_id() -> str:
    """A fresh tool-call id: ``call_`` + 24 hex digits (96 random bits, so ids never collide in practice)."""
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True)
class FunctionView:
    """``call.function.name`` / ``call.function.arguments``, as the OpenAI client objects read."""

    name: str | None
    arguments: str | None


@dataclass
class ToolCall:
    """One complete tool call. ``arguments`` is a JSON object as text (what OpenAI clients ``json.loads``)."""

    id: str
    name: str
    arguments: str
    type: str = "function"

    @property
    def function(self) -> FunctionView:
        return FunctionView(self.name, self.arguments)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type,
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass
class ParsedOutput:
    """A parsed completion: visible text, reasoning, tool calls and why generation ended.

    ``content`` and ``reasoning_content`` are ``None`` when empty (OpenAI sends ``null``).
    ``finish_reason`` is ``"tool_calls"`` when at least one call was made, ``"length"`` when the output was
    truncated without a call, else ``"stop"``.
    """

    content: str | None
    reasoning_content: str | None
    tool_calls: list[ToolCall]
    finish_reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "content": self.content,
            "reasoning_content": self.reasoning_content,
            "tool_calls": [call.to_dict() for call in self.tool_calls],
            "finish_reason": self.finish_reason,
        }


@dataclass
class ToolCallDelta:
    """One entry of a streaming ``delta.tool_calls`` list.

    The first delta of a call carries ``id``, ``type`` and ``name`` with ``arguments=""``; later deltas
    carry only ``index`` and an ``arguments`` fragment. Fragments of one call concatenate to its JSON.
    """

    index: int
    id: str | None = None
    type: str | None = None
    name: str | None = None
    arguments: str | None = None

    @property
    def function(self) -> FunctionView:
        return FunctionView(self.name, self.arguments)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index}
        if self.id is not None:
            out["id"] = self.id
        if self.type is not None:
            out["type"] = self.type
        function: dict[str, str] = {}
        if self.name is not None:
            function["name"] = self.name
        if self.arguments is not None:
            function["arguments"] = self.arguments
        if function:
            out["function"] = function
        return out


@dataclass
class Delta:
    """One streaming ``delta``: reasoning text, visible text, or tool-call entries."""

    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        if self.content is not None:
            out["content"] = self.content
        if self.tool_calls:
            out["tool_calls"] = [tc.to_dict() for tc in self.tool_calls]
        return out
