"""Chat prompts and output parsing for the offline API: which encoder and parsers a model family uses.

* V3.2 (DSA models): the V3.2 encoder of :mod:`dsa_runtime.parsers` (V3.2 ships no Jinja template), the
  ``deepseekv32`` DSML tool-call parser and the ``deepseek-v3`` reasoning parser.
* V3 / R1 / V3.1 (dense): the checkpoint's own Jinja chat template (``chat_template.jinja`` or
  ``tokenizer_config.json``), else the shipped one; V3.1 is told apart by its ``ue8m0`` FP8 scale format
  (V3 and R1 have none), which selects the ``deepseek_v31`` template and the ``deepseekv31`` tool parser,
  else ``deepseek_v3`` / ``deepseekv3``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsa_runtime.engine.outputs import RequestOutput

REASONING_PARSER = "deepseek-v3"


@dataclass(frozen=True)
class ChatFormat:
    """How one model's chats are written and read back."""

    encoder: str  # "v32" or "jinja"
    tool_parser: str
    template: str | None = None


@dataclass
class ChatResult:
    """A parsed chat completion.

    ``content`` / ``reasoning_content`` are None when empty; ``tool_calls`` are
    :class:`dsa_runtime.parsers.ToolCall`; ``text`` is the raw generated text; ``finish_reason`` is the
    parser's (``"tool_calls"`` when a call was made); ``output`` is the engine's final output.
    """

    content: str | None
    reasoning_content: str | None
    tool_calls: list[Any]
    text: str
    finish_reason: str
    prompt: str
    output: RequestOutput | None = field(default=None, repr=False)
    forced: str = ""  # the forced opening of a required / named tool_choice: the end of ``prompt``, parsed before ``text``


def chat_format(model_config: Any, checkpoint_dir: str | Path | None = None) -> ChatFormat:
    """The chat format of a model (see the module docstring)."""
    if model_config.is_dsa:
        return ChatFormat("v32", "deepseekv32")
    from dsa_runtime.parsers.jinja_template import builtin_template, load_chat_template

    v31 = model_config.scale_fmt == "ue8m0"
    fallback = "deepseek_v31" if v31 else "deepseek_v3"
    template = (
        load_chat_template(checkpoint_dir, fallback=fallback)
        if checkpoint_dir
        else builtin_template(fallback)
    )
    return ChatFormat("jinja", "deepseekv31" if v31 else "deepseekv3", template)


def render_prompt(
    fmt: ChatFormat,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    thinking: bool = False,
) -> str:
    """Prompt text (it starts with the BOS token's text) ending in the assistant's opener."""
    if fmt.encoder == "v32":
        from dsa_runtime.parsers import encode_messages

        return encode_messages(messages, "thinking" if thinking else "chat", tools=tools)
    from dsa_runtime.parsers.jinja_template import render_chat_template

    return render_chat_template(fmt.template or "", messages, tools=tools, thinking=thinking)


def prepare_chat(
    fmt: ChatFormat,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    thinking: bool,
    tool_choice: Any = None,
) -> tuple[str, Any, bool]:
    """``(prompt text, resolved ToolChoice, thinking)`` of one chat turn, as the server builds it.

    The prompt shows the tools ``tool_choice`` allows and ends with its forced opening (``required`` /
    named); a forced reply is written with thinking off (see :mod:`dsa_runtime.parsers.tool_choice`).
    Raises ``ToolChoiceError`` (a ``DSAError``) for a bad ``tool_choice``.
    """
    from dsa_runtime.parsers.tool_choice import resolve_tool_choice

    choice = resolve_tool_choice(tools, tool_choice, fmt.tool_parser)
    thinking = choice.thinking(thinking)
    return render_prompt(fmt, messages, choice.tools, thinking) + choice.forced, choice, thinking


def output_parser(fmt: ChatFormat, thinking: bool, parse_calls: bool = True) -> Any:
    """A fresh :class:`dsa_runtime.parsers.OutputParser` for one completion (``parse_calls=False``: none)."""
    from dsa_runtime.parsers import OutputParser

    return OutputParser(fmt.tool_parser if parse_calls else None, REASONING_PARSER, thinking=thinking)


def parse_completion(
    fmt: ChatFormat,
    prompt: str,
    output: RequestOutput,
    thinking: bool,
    forced: str = "",
    parse_calls: bool = True,
) -> ChatResult:
    """Parse a completion; ``forced`` (the prompt's forced opening) is read before the generated text."""
    parser = output_parser(fmt, thinking, parse_calls)
    parsed = parser.parse(forced + output.text, truncated=output.finish_reason == "length")
    return ChatResult(
        content=parsed.content,
        reasoning_content=parsed.reasoning_content,
        tool_calls=list(parsed.tool_calls),
        text=output.text,
        finish_reason=parsed.finish_reason,
        prompt=prompt,
        output=output,
        forced=forced,
    )
