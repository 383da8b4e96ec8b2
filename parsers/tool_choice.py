"""``tool_choice`` for DeepSeek chats: the tools the model sees, whether calls are parsed, the forced opening.

``required`` and a named choice are enforced by a forced continuation (for V3.2 on a server with xgrammar the
rest of the call is also grammar-constrained: ``dsa_runtime.server.structured.tool_call_constraint``): the
assistant reply is made to begin with the opening of a tool-call block in the model's own format (a named
choice: also the opening of a call to that function), appended to the prompt; the model writes the rest
(the arguments, or for ``required`` the call itself). The forced text is prompt (it counts in
``usage.prompt_tokens``, never in ``completion_tokens``) and is fed to the output parser before the generated
text, so the caller gets an ordinary tool call with its id, name and arguments.

A forced reply is written in non-thinking mode (:meth:`ToolChoice.thinking`): the call must open the reply,
and DeepSeek's formats put reasoning before it, so the prompt is rendered with thinking off (V3.2 and V3.1:
the generation prompt ends in ``</think>``; R1: no ``<think>``) and ``reasoning_content`` is empty.

Openings, by the model's own tool-call format (its default tool parser)::

    deepseekv32  "\\n\\n<｜DSML｜function_calls>\\n"   + '<｜DSML｜invoke name="NAME">\\n'
    deepseekv31  "<｜tool▁calls▁begin｜>"             + "<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>"
    deepseekv3   "<｜tool▁calls▁begin｜>"             + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n"

(``required`` stops after the first part.) The DSML text comes from the V3.2 encoder's own renderer
(:func:`~dsa_runtime.parsers.dsml_render.tool_call_opening`); the V3.1 / V3 texts are those of the models'
chat templates for an assistant turn that is only a tool call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsa_runtime.errors import DSAError
from dsa_runtime.parsers.markers import TOOL_CALL_BEGIN, TOOL_CALLS_BEGIN, TOOL_SEP

MODES = ("none", "auto", "required")


class ToolChoiceError(DSAError):
    """A ``tool_choice`` that is malformed or cannot be honoured (an HTTP server answers 400 on it)."""


@dataclass(frozen=True)
class ToolChoice:
    """A resolved ``tool_choice``.

    Attributes:
        mode: ``none``, ``auto``, ``required`` or ``named``.
        tools: the tools to render in the prompt (``None``: no tools section); a named choice shows only its
            function, ``none`` shows none.
        function: the named function (``named`` only).
        forced: the text that opens the assistant reply (``""`` unless ``required`` / ``named``).
    """

    mode: str
    tools: list[Any] | None
    function: str | None = None
    forced: str = ""

    @property
    def parse_calls(self) -> bool:
        """Whether tool calls are parsed from the completion (``none``: any call markup stays content)."""
        return self.mode != "none"

    def thinking(self, requested: bool) -> bool:
        """Whether the reply is written in thinking mode: as requested, except that a forced reply never is."""
        return requested and not self.forced


def tool_name(tool: Any) -> str | None:
    """The function name of an OpenAI tool (``{"type": "function", "function": {"name"}}``) or a bare schema."""
    if not isinstance(tool, Mapping):
        return None
    fn = tool.get("function", tool)
    name = fn.get("name") if isinstance(fn, Mapping) else None
    return name if isinstance(name, str) else None


def resolve_tool_choice(tools: Sequence[Any] | None, tool_choice: Any, call_format: str) -> ToolChoice:
    """Resolve an OpenAI ``tool_choice`` against the request's ``tools`` for a model whose calls are written
    in ``call_format`` (its default tool-parser name: ``deepseekv32``, ``deepseekv31``, ``deepseekv3``, or an
    alias).

    ``None`` means ``auto`` when tools are given, else ``none``.

    Raises:
        ToolChoiceError: an unknown mode or malformed named choice, ``auto`` / ``required`` / named without
            tools, a named function that is not among the tools.
        dsa_runtime.errors.ConfigError: an unknown ``call_format``.
    """
    listed = list(tools) if tools else []
    choice = tool_choice if tool_choice is not None else ("auto" if listed else "none")
    if isinstance(choice, str):
        if choice not in MODES:
            raise ToolChoiceError(
                f"tool_choice must be 'none', 'auto', 'required' or a named function, got {choice!r}"
            )
        if choice == "none":
            return ToolChoice("none", None)
        if not listed:
            raise ToolChoiceError(f"tool_choice '{choice}' needs 'tools'")
        forced = forced_opening(call_format, None) if choice == "required" else ""
        return ToolChoice(choice, listed, forced=forced)
    function = choice.get("function") if isinstance(choice, Mapping) and choice.get("type") == "function" else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ToolChoiceError("a named tool_choice must be {'type': 'function', 'function': {'name': NAME}}")
    chosen = [t for t in listed if tool_name(t) == name]
    if not chosen:
        raise ToolChoiceError(f"tool_choice names the function '{name}', which is not in 'tools'")
    return ToolChoice("named", chosen, name, forced_opening(call_format, name))


def forced_opening(call_format: str, name: str | None) -> str:
    """The forced start of a tool-call reply (see the module docstring); ``name=None`` for ``required``."""
    from dsa_runtime.parsers.plugin import resolve_spec

    fmt = resolve_spec("tool", call_format).name
    if fmt == "deepseekv32":
        from dsa_runtime.parsers.dsml_render import tool_call_opening

        return tool_call_opening(name)
    if name is None:
        return TOOL_CALLS_BEGIN
    if fmt == "deepseekv31":
        return TOOL_CALLS_BEGIN + TOOL_CALL_BEGIN + name + TOOL_SEP
    return TOOL_CALLS_BEGIN + TOOL_CALL_BEGIN + "function" + TOOL_SEP + name + "\n```json\n"
