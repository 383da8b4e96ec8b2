"""DeepSeek-V3.2 chat encoding: OpenAI-style messages -> prompt text (docs/parsers.md).

V3.2 ships no Jinja chat template; this module is the prompt format. The output for the official test
conversation is byte-identical to ``tests/parsers/golden/dsv32_encoding_output.txt``.

Choices where the official encoder is silent or unsafe (documented here because callers depend on them):

* ``context`` is the list of *earlier messages* that were already encoded (a prompt prefix). Only
  ``messages`` are rendered, but every index-dependent rule (last user turn, tool-result grouping) is
  computed over ``context + messages``, so ``encode(ctx + msgs)`` always ends with
  ``encode(msgs, context=ctx)``. No BOS is written when a non-empty context is passed. Indices in error
  messages count the context messages first.
* ``drop_thinking=True`` (default) is the official behaviour: reasoning is only rendered for assistant
  turns after the last user/developer message. ``drop_thinking=False`` (thinking mode only) keeps the
  reasoning of earlier turns: every user/developer message and every tool-result group then opens
  ``<think>`` and every assistant turn renders ``{reasoning}</think>``, which makes the prompt of a growing
  conversation append-only (a turn renders the same bytes before and after later turns are added).
* Request-level ``tools``/``response_format`` (keywords, or carried by a leading user message) are
  attached to the leading system/developer message; when the conversation has none, they are rendered
  exactly as an empty system message would render them, without ever placing a tools block before an
  existing system prompt (upstream bug 15, vLLM #54911).
* ``add_generation_prompt=False`` omits the opener that would end the prompt (``<｜Assistant｜>`` + think
  token after a final user/developer message, ``\\n\\n<think>``/``\\n\\n</think>`` after a final tool-result
  group); ``continue_final_message=True`` (or ``"prefix": true`` on the final assistant message) leaves
  that assistant turn open, without ``<｜end▁of▁sentence｜>``, so generation continues it (upstream bug 16).
  A history that simply ends in a complete assistant turn is rendered as is (the golden prompt does).
* Tool results are matched to the preceding assistant's calls by order (not ``tool_call_id``), in one
  forward pass (upstream bug 17: no backward rescan per tool message). A result without a call, more
  results than calls, or a group cut short by another message is an error instead of a malformed prompt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from dsa_runtime.parsers.dsml_render import (
    BLOCK_SEPARATOR,
    function_schemas,
    render_tool_calls,
)
from dsa_runtime.parsers.encoding_errors import EncodingError
from dsa_runtime.parsers.tools_prompt_v32 import (
    ASSISTANT,
    BOS,
    EOS,
    THINK_END,
    THINK_START,
    USER,
    render_response_format,
    render_tools_block,
)

__all__ = [
    "EncodingError",
    "ThinkingMode",
    "encode_messages",
    "function_schemas",
    "render_assistant_completion",
    "render_tool_calls",
]

ThinkingMode = Literal["thinking", "chat"]
THINKING_MODES: tuple[str, ...] = ("thinking", "chat")
ROLES: frozenset[str] = frozenset({"system", "user", "developer", "assistant", "tool"})
# Roles that count as "the user's turn" for the last-user index (the developer role is the search-agent
# variant of a user message).
_USER_ROLES = frozenset({"user", "developer"})

Message = Mapping[str, Any]


# --------------------------------------------------------------------------------------------------
# public API


def encode_messages(
    messages: Sequence[Message],
    thinking_mode: ThinkingMode = "thinking",
    *,
    context: Sequence[Message] | None = None,
    drop_thinking: bool = True,
    add_default_bos_token: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
    response_format: Any = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
) -> str:
    """Render ``messages`` as a DeepSeek-V3.2 prompt.

    Args:
        messages: OpenAI-style dicts (``role`` system/user/developer/assistant/tool; ``content``;
            assistant ``reasoning_content`` (or ``reasoning``) and ``tool_calls``; ``tools`` and
            ``response_format`` on system/developer messages).
        thinking_mode: ``"thinking"`` (the reply starts inside ``<think>``) or ``"chat"``.
        context: earlier messages already encoded (see the module docstring); not rendered.
        drop_thinking: see the module docstring.
        add_default_bos_token: prepend BOS when there is no context.
        tools / response_format: request-level values, attached to the leading system message.
        add_generation_prompt / continue_final_message: see the module docstring.

    Raises:
        EncodingError: on malformed input, naming the message index.
    """
    mode = _check_mode(thinking_mode)
    ctx = _as_messages(context, "context") if context else []
    new = _as_messages(messages, "messages")
    full = ctx + new
    n_ctx = len(ctx)

    full, preamble = _attach_request_level(full, n_ctx, tools, response_format)
    last = len(full) - 1
    if new and full[last].get("prefix") is True:
        continue_final_message = True
    if continue_final_message and (not new or full[last]["role"] != "assistant"):
        raise EncodingError("continue_final_message needs messages that end with an assistant message")

    last_user = _last_user_index(full)
    thinking = mode == "thinking"
    keep_thinking = thinking and not drop_thinking
    slots = _tool_result_slots(full)

    parts: list[str] = []
    if add_default_bos_token and n_ctx == 0:
        parts.append(BOS)
    parts.append(preamble)
    for i in range(n_ctx, len(full)):
        msg = full[i]
        role = msg["role"]
        where = f"message {i} ({role})"
        # The opener ending the prompt is the generation prompt; openers mid-conversation are structure.
        opener = add_generation_prompt or i != last
        if role == "system":
            parts.append(_text(msg.get("content"), where, required=False))
            parts.append(_extras(msg, where))
        elif role == "user":
            parts.append(USER + _text(msg.get("content"), where, required=True))
            if opener:
                parts.append(ASSISTANT + _think_token(keep_thinking or (thinking and i == last_user)))
        elif role == "developer":
            content = _text(msg.get("content"), where, required=True)
            if not content:
                raise EncodingError(f"{where}: a developer message needs non-empty 'content'")
            parts.append(USER + _extras(msg, where) + "\n\n# The user's message is: " + content)
            if opener:
                parts.append(ASSISTANT + _think_token(keep_thinking or (thinking and i == last_user)))
        elif role == "tool":
            order, total = slots[i]
            if order == 1:
                parts.append("\n\n<function_results>")
            parts.append("\n<result>" + _text(msg.get("content"), where, required=True) + "</result>")
            if order == total:
                parts.append("\n</function_results>")
                if opener:
                    # Results of the current exchange reopen reasoning (the turn goes on).
                    parts.append("\n\n" + _think_token(keep_thinking or (thinking and i >= last_user)))
        else:  # assistant (roles were validated up front)
            after_last_user = i > last_user
            is_open = continue_final_message and i == last
            if (
                thinking
                and after_last_user
                and not is_open
                and not (_reasoning(msg, where) or msg.get("tool_calls"))
            ):
                raise EncodingError(
                    f"{where}: in thinking mode an assistant message after the last user message needs "
                    "'reasoning_content' or 'tool_calls'"
                )
            parts.append(
                _render_assistant(
                    msg,
                    where,
                    show_reasoning=thinking and (after_last_user or keep_thinking),
                    open_end=is_open,
                )
            )
    return "".join(parts)


def render_assistant_completion(message: Message, thinking_mode: ThinkingMode = "thinking") -> str:
    """The text the model generates for this assistant turn after the prompt has opened the reply.

    Thinking mode: ``{reasoning}</think>{content}[\\n\\n{DSML block}]<｜end▁of▁sentence｜>`` (the prompt
    ended in ``<think>``); chat mode: the same without the reasoning part. Equal to what
    :func:`encode_messages` renders for an assistant turn after the last user message, so it is the
    input a tool/reasoning parser must turn back into this message.
    """
    mode = _check_mode(thinking_mode)
    if not isinstance(message, Mapping) or message.get("role", "assistant") != "assistant":
        raise EncodingError("render_assistant_completion needs an assistant message")
    return _render_assistant(message, "assistant message", show_reasoning=mode == "thinking", open_end=False)


# --------------------------------------------------------------------------------------------------
# helpers


def _think_token(opens: bool) -> str:
    """``<think>`` when the reply that follows starts inside reasoning, else ``</think>``."""
    return THINK_START if opens else THINK_END


def _check_mode(thinking_mode: str) -> str:
    if thinking_mode not in THINKING_MODES:
        raise EncodingError(f"thinking_mode must be one of {THINKING_MODES}, not {thinking_mode!r}")
    return thinking_mode


def _as_messages(value: Any, name: str) -> list[Message]:
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise EncodingError(f"{name} must be a list of message objects")
    items = list(value)
    for i, msg in enumerate(items):
        if not isinstance(msg, Mapping):
            raise EncodingError(f"{name}[{i}] is not a message object")
        role = msg.get("role")
        if role not in ROLES:
            raise EncodingError(
                f"{name}[{i}]: unknown role {role!r} (expected one of {', '.join(sorted(ROLES))})"
            )
    return items


def _attach_request_level(
    full: list[Message], n_ctx: int, tools: Any, response_format: Any
) -> tuple[list[Message], str]:
    """Attach request-level tools/response_format; return the messages and a text rendered before them.

    The text is non-empty only when the conversation does not start with a system or developer message:
    it is then what an empty leading system message carrying them would render.
    """
    given = bool(tools) or response_format is not None
    if given and n_ctx:
        raise EncodingError(
            "tools/response_format cannot be attached when a context is passed: the leading message was "
            "already encoded (attach them to the context's first message instead)"
        )
    first = full[0] if full else None
    first_role = first["role"] if first is not None else None
    # Tools carried by anything other than a system/developer message are not rendered by the format;
    # accept them on a leading user message (request-level tools attached to messages[0]), refuse them
    # elsewhere rather than dropping them silently.
    for i, msg in enumerate(full):
        if msg["role"] in ("system", "developer") or (i == 0 and msg["role"] == "user"):
            continue
        if msg.get("tools") or msg.get("response_format") is not None:
            raise EncodingError(
                f"message {i} ({msg['role']}): 'tools'/'response_format' only belong on a system or developer "
                "message (or on the first message)"
            )
    if first is None:
        return full, (
            _extras({"tools": tools, "response_format": response_format}, "request") if given else ""
        )
    if first_role in ("system", "developer"):
        if not given:
            return full, ""
        if (tools and first.get("tools")) or (
            response_format is not None and first.get("response_format") is not None
        ):
            raise EncodingError(
                f"message 0 ({first_role}): tools/response_format given twice (keyword and message)"
            )
        merged = dict(first)
        if tools:
            merged["tools"] = tools
        if response_format is not None:
            merged["response_format"] = response_format
        return [merged, *full[1:]], ""
    # No leading system/developer message: render the extras where an empty system message would.
    carried = {"tools": first.get("tools"), "response_format": first.get("response_format")}
    if given and (carried["tools"] or carried["response_format"] is not None):
        raise EncodingError(
            f"message 0 ({first_role}): tools/response_format given twice (keyword and message)"
        )
    if given:
        carried = {"tools": tools, "response_format": response_format}
    if n_ctx:  # the first message is context: whatever it carried was rendered (or not) already
        return full, ""
    return full, _extras(carried, "message 0")


def _extras(msg: Mapping[str, Any], where: str) -> str:
    """``\\n\\n`` + tools block and/or ``\\n\\n`` + response-format section, as a system message appends them."""
    out = ""
    tools = msg.get("tools")
    if tools:
        out += "\n\n" + render_tools_block(function_schemas(tools, f"{where} tools"))
    response_format = msg.get("response_format")
    if response_format is not None:
        out += "\n\n" + render_response_format(response_format)
    return out


def _last_user_index(full: Sequence[Message]) -> int:
    for i in range(len(full) - 1, -1, -1):
        if full[i]["role"] in _USER_ROLES:
            return i
    return -1


def _tool_result_slots(full: Sequence[Message]) -> dict[int, tuple[int, int]]:
    """Map each tool message index to (position in its result group, number of calls), in one pass."""
    slots: dict[int, tuple[int, int]] = {}
    owner, calls, seen = -1, 0, 0
    for i, msg in enumerate(full):
        role = msg["role"]
        if role == "tool":
            if owner < 0:
                raise EncodingError(f"message {i} (tool): tool result with no preceding assistant tool call")
            if seen >= calls:
                raise EncodingError(
                    f"message {i} (tool): more tool results than the {calls} tool call(s) of message {owner}"
                )
            seen += 1
            slots[i] = (seen, calls)
            continue
        if 0 < seen < calls:
            raise EncodingError(
                f"message {i} ({role}): message {owner} made {calls} tool calls but only {seen} result(s) follow"
            )
        tool_calls = msg.get("tool_calls") if role == "assistant" else None
        if tool_calls:
            if not isinstance(tool_calls, Sequence) or isinstance(tool_calls, (str, bytes)):
                raise EncodingError(f"message {i} (assistant): 'tool_calls' must be a list")
            owner, calls, seen = i, len(tool_calls), 0
        else:
            owner, calls, seen = -1, 0, 0
    return slots


def _text(value: Any, where: str, *, required: bool) -> str:
    """Message content as text: a string, or a list of OpenAI ``{"type": "text"}`` parts joined."""
    if value is None:
        if required:
            raise EncodingError(f"{where}: missing 'content'")
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts: list[str] = []
        for part in value:
            if not (
                isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)
            ):
                raise EncodingError(f"{where}: only text content parts can be encoded")
            texts.append(part["text"])
        return "".join(texts)
    raise EncodingError(f"{where}: 'content' must be a string, not {type(value).__name__}")


def _reasoning(msg: Message, where: str) -> str:
    value = msg.get("reasoning_content")
    if value is None:
        value = msg.get("reasoning")  # newer OpenAI-compatible servers use this name
    if value is None:
        return ""
    if not isinstance(value, str):
        raise EncodingError(f"{where}: 'reasoning_content' must be a string")
    return value


def _render_assistant(msg: Message, where: str, *, show_reasoning: bool, open_end: bool) -> str:
    reasoning = _reasoning(msg, where) if show_reasoning else ""
    content = _text(msg.get("content"), where, required=False)
    tool_calls = msg.get("tool_calls")
    if open_end:
        if tool_calls:
            raise EncodingError(f"{where}: an assistant message that is continued cannot carry 'tool_calls'")
        # With reasoning shown and no visible content yet, the reply is still inside <think>.
        if show_reasoning and not content:
            return reasoning
        return (reasoning + THINK_END if show_reasoning else "") + content
    head = reasoning + THINK_END if show_reasoning else ""
    block = BLOCK_SEPARATOR + render_tool_calls(tool_calls, where) if tool_calls else ""
    return head + content + block + EOS
