"""Responses API input -> the chat request the chat path renders (one renderer for both endpoints).

Items map onto chat messages: ``message`` items (``developer`` is OpenAI's name for instructions, so it becomes
a ``system`` message: DeepSeek-V3.2's own ``developer`` role is its search-agent turn), ``function_call`` items
onto the assistant's ``tool_calls`` (consecutive calls, and calls after an assistant message, make one assistant
turn; a call cut off by the token limit, ``status: "incomplete"``, is left out), ``function_call_output`` items
onto ``tool`` messages (put in the order of the calls they answer: the V3.2 encoding matches results to calls by
position), and ``reasoning`` items onto the ``reasoning_content`` of the assistant turn that follows them. Function tools, ``tool_choice`` and ``text.format`` are rewritten into
their chat forms; every problem is a 400 naming the Responses field (``input.3.call_id``, ``tools.0.type``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from dsa_runtime.server.errors import APIError, bad_request

ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")

# Chat field names in errors raised by the chat path -> the Responses field that carried them.
_RENAMES = (("response_format.json_schema.schema", "text.format.schema"),
            ("response_format.json_schema", "text.format"), ("response_format", "text.format"),
            ("max_completion_tokens", "max_output_tokens"), ("max_tokens", "max_output_tokens"),
            ("messages", "input"), ("reasoning_effort", "reasoning.effort"))


def input_items(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``input`` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return value


def to_messages(items: list[Mapping[str, Any]], where: Callable[[int], str]) -> list[dict[str, Any]]:
    """Chat messages of a conversation's items; ``where(i)`` names item ``i`` in an error's ``param``."""
    messages: list[dict[str, Any]] = []
    reasoning: list[str] = []  # reasoning items waiting for the assistant turn they belong to
    calls: dict[str, tuple[int, int]] = {}  # call_id -> (its assistant message, its position there)
    answered: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise bad_request("each input item must be an object", param=where(i))
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise bad_request(f"role must be one of {', '.join(_ROLES)}, got {role!r}", param=f"{where(i)}.role")
            text = _content_text(item.get("content"), f"{where(i)}.content")
            if role == "assistant":
                messages.append(_assistant(reasoning, content=text))
            else:
                reasoning.clear()  # reasoning with no assistant turn after it belongs to nothing
                messages.append({"role": _ROLES[role], "content": text})
        elif kind == "function_call" and item.get("status") == "incomplete":
            continue  # cut off by the token limit: its arguments end mid-value, and it never ran
        elif kind == "function_call":
            call_id = _string(item, "call_id", where(i))
            call = {"id": call_id, "type": "function",
                    "function": {"name": _string(item, "name", where(i)), "arguments": _string(item, "arguments",
                                                                                               where(i))}}
            if call_id in calls:
                raise bad_request(f"call_id {call_id!r} is used by two function calls", param=f"{where(i)}.call_id")
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant" or reasoning:
                last = _assistant(reasoning)
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
            calls[call_id] = (len(messages) - 1, len(last["tool_calls"]) - 1)
        elif kind == "function_call_output":
            call_id = _string(item, "call_id", where(i))
            if call_id not in calls:
                raise bad_request(f"no function_call with call_id {call_id!r} comes before this output",
                                  param=f"{where(i)}.call_id")
            if call_id in answered:
                raise bad_request(f"call_id {call_id!r} has two outputs", param=f"{where(i)}.call_id")
            answered.add(call_id)
            output = _content_text(item.get("output"), f"{where(i)}.output")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "reasoning":
            reasoning.append(_reasoning_text(item, where(i)))
        else:
            raise bad_request(f"input item type {kind!r} is not supported (supported: {', '.join(ITEM_TYPES)})",
                              param=f"{where(i)}.type")
    missing = [c for c in calls if c not in answered]
    if missing:
        raise bad_request(f"no function_call_output for the function call with call_id {missing[0]!r}",
                          param="input")
    return _results_in_call_order(messages, calls)


def _assistant(reasoning: list[str], content: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant"}
    if content is not None:
        message["content"] = content
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
        reasoning.clear()
    return message


def _results_in_call_order(messages: list[dict[str, Any]], calls: dict[str, tuple[int, int]]) -> list[dict[str, Any]]:
    """Each run of tool messages sorted by the position of its call in the assistant turn (clients may send the
    outputs of parallel calls in any order; the V3.2 encoding pairs them by position)."""
    out: list[dict[str, Any]] = []
    run: list[dict[str, Any]] = []
    for message in [*messages, None]:
        if message is not None and message["role"] == "tool":
            run.append(message)
            continue
        out.extend(sorted(run, key=lambda m: calls[m["tool_call_id"]]))
        run = []
        if message is not None:
            out.append(message)
    return out


def _string(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise bad_request(f"'{key}' must be a string", param=f"{where}.{key}")
    return value


def _content_text(content: Any, param: str) -> str:
    """A message's content (a string or a list of text parts) as one string."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request("content must be a string or a list of text parts", param=param)
    pieces = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        key = _TEXT_PARTS.get(kind)
        if key is None:
            raise bad_request(f"content part type {kind!r} is not supported (only text parts: "
                              f"{', '.join(_TEXT_PARTS)})", param=f"{param}.{j}.type")
        if not isinstance(part.get(key), str):
            raise bad_request(f"a {kind} part needs a string '{key}'", param=f"{param}.{j}.{key}")
        pieces.append(part[key])
    return "".join(pieces)


def _reasoning_text(item: Mapping[str, Any], where: str) -> str:
    """A reasoning item's text: its ``reasoning_text`` content, else its summary."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if parts is None:
            continue
        if not isinstance(parts, list) or not all(isinstance(p, Mapping) and isinstance(p.get("text"), str)
                                                  for p in parts):
            raise bad_request(f"'{key}' must be a list of parts with a string 'text'", param=f"{where}.{key}")
        if parts:
            return "".join(p["text"] for p in parts)
    return ""


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses function tools (``{"type": "function", "name", "parameters", ...}``) in their chat form."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise bad_request(f"tool type {tool.get('type')!r} is not supported (only 'function' tools)",
                              param=f"tools.{i}.type")
        if not isinstance(tool.get("name"), str):
            raise bad_request("a function tool needs a string 'name'", param=f"tools.{i}.name")
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """``{"type": "function", "name"}`` -> the chat form; the modes pass through (the chat path checks them)."""
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise bad_request("tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}",
                          param="tool_choice")
    return {"type": "function", "function": {"name": choice["name"]}}


def chat_response_format(fmt: dict[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` (``text``, ``json_object``, or ``json_schema`` with the schema inline) as the chat
    ``response_format``."""
    if fmt is None or fmt.get("type") in ("text", "json_object"):
        return fmt
    if fmt.get("type") != "json_schema":
        raise bad_request(f"text.format.type must be 'text', 'json_object' or 'json_schema', got "
                          f"{fmt.get('type')!r}", param="text.format.type")
    if not isinstance(fmt.get("schema"), dict):
        raise bad_request("a json_schema format needs a 'schema' object", param="text.format.schema")
    inner = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
    return {"type": "json_schema", "json_schema": inner}


def check_effort(effort: str | None) -> None:
    if effort is not None and effort not in EFFORTS:
        raise bad_request(f"reasoning.effort must be one of {', '.join(EFFORTS)}, got {effort!r}",
                          param="reasoning.effort")


def renamed(exc: APIError) -> APIError:
    """An error of the chat path with its field named as the Responses request names it."""
    param = exc.param
    tool = re.fullmatch(r"tools\.(\d+)\.function\.(.+)", param or "")
    if tool is not None:  # the chat form nests a tool's fields under "function"
        return APIError(exc.message, status=exc.status, type=exc.type, param=f"tools.{tool[1]}.{tool[2]}",
                        code=exc.code)
    for chat, responses in _RENAMES:
        if param is not None and (param == chat or param.startswith(chat + ".")):
            message = exc.message.replace(chat, responses) if chat.startswith("max_") else exc.message
            return APIError(message, status=exc.status, type=exc.type, param=responses + param[len(chat):],
                            code=exc.code)
    return exc
