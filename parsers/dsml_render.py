"""DSML rendering for the V3.2 prompt: tool schemas and assistant tool calls (the shape in :mod:`.dsml`).

Value encoding: a string argument is written raw with ``string="true"`` (no quotes, no escaping); any other
value as ``json.dumps(..., ensure_ascii=False)`` with ``string="false"``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from dsa_runtime.parsers.encoding_errors import EncodingError
from dsa_runtime.parsers.tools_prompt_v32 import (
    DSML,
    FUNCTION_CALLS_END,
    FUNCTION_CALLS_START,
    INVOKE_END,
    PARAMETER_END,
)

__all__ = [
    "BLOCK_SEPARATOR",
    "function_schemas",
    "invoke_open_tag",
    "render_tool_calls",
    "tool_call_opening",
]

# What an assistant turn writes between its content and its function_calls block (also when the content is
# empty: a reply that is only a call starts with it).
BLOCK_SEPARATOR = "\n\n"
_BLOCK_OPEN = FUNCTION_CALLS_START + "\n"  # each invoke starts on its own line


def render_tool_calls(tool_calls: Sequence[Mapping[str, Any]], where: str = "tool_calls") -> str:
    """One DSML ``function_calls`` block holding every call (without the ``\\n\\n`` that precedes it).

    Calls are OpenAI-style (``{"function": {"name", "arguments"}}``) or flat (``{"name", "arguments"}``);
    ``arguments`` is a JSON object given as text or as a mapping.
    """
    if not isinstance(tool_calls, Sequence) or isinstance(tool_calls, (str, bytes)) or not tool_calls:
        raise EncodingError(f"{where}: 'tool_calls' must be a non-empty list")
    invokes: list[str] = []
    for j, call in enumerate(tool_calls):
        name, arguments = _name_and_arguments(call, f"{where} tool_calls[{j}]")
        params = "\n".join(_render_parameter(key, value) for key, value in arguments.items())
        invokes.append(f"{invoke_open_tag(name)}\n{params}\n{INVOKE_END}")
    return _BLOCK_OPEN + "\n".join(invokes) + "\n" + FUNCTION_CALLS_END


def invoke_open_tag(name: str) -> str:
    """The opening ``invoke`` tag of a call to ``name`` (the function name is written as is)."""
    return f'<{DSML}invoke name="{name}">'


def tool_call_opening(name: str | None = None) -> str:
    """How an assistant reply that is only a tool call begins, byte for byte as the encoder renders one.

    ``"\\n\\n<｜DSML｜function_calls>\\n"``, plus ``'<｜DSML｜invoke name="NAME">\\n'`` when ``name`` is given:
    the start of :func:`render_tool_calls` after :data:`BLOCK_SEPARATOR`, i.e. what follows the prompt's
    ``</think>`` in a chat-mode turn with empty content. Used to force ``tool_choice`` (required / named).
    """
    head = BLOCK_SEPARATOR + _BLOCK_OPEN
    return head if name is None else head + invoke_open_tag(name) + "\n"


def function_schemas(tools: Any, where: str = "tools") -> list[Mapping[str, Any]]:
    """Unwrap OpenAI tools (``{"type": "function", "function": {...}}``) to their function schemas.

    A bare schema (a mapping with ``name``) is accepted as is.
    """
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
        raise EncodingError(f"{where}: 'tools' must be a list of tool definitions")
    out: list[Mapping[str, Any]] = []
    for j, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            out.append(fn)
        elif isinstance(tool, Mapping) and isinstance(tool.get("name"), str):
            out.append(tool)
        else:
            raise EncodingError(f"{where}[{j}]: a tool needs a 'function' object with a 'name'")
    return out


def _name_and_arguments(call: Any, where: str) -> tuple[str, Mapping[str, Any]]:
    if not isinstance(call, Mapping):
        raise EncodingError(f"{where}: a tool call must be an object")
    fn = call.get("function")
    if not isinstance(fn, Mapping):
        fn = call
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise EncodingError(f"{where}: missing function 'name'")
    raw = fn.get("arguments")
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return name, {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise EncodingError(
                f"{where} ({name}): arguments are not valid JSON: {exc.msg} at {exc.pos}"
            ) from None
    if not isinstance(raw, Mapping):
        raise EncodingError(f"{where} ({name}): arguments must be a JSON object")
    for key in raw:
        if not isinstance(key, str):
            raise EncodingError(f"{where} ({name}): argument names must be strings")
    return name, raw


def _render_parameter(key: str, value: Any) -> str:
    # Strings are written raw (no quotes or escaping); everything else as JSON, as DeepSeek's own encoder does.
    if isinstance(value, str):
        flag, text = "true", value
    else:
        flag, text = "false", json.dumps(value, ensure_ascii=False)
    return f'<{DSML}parameter name="{key}" string="{flag}">{text}{PARAMETER_END}'
