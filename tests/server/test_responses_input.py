"""Responses input items -> chat messages (``core/server/responses_input.py``), without a server."""

from __future__ import annotations

import pytest

from dsa_runtime.server.errors import APIError
from dsa_runtime.server.responses_input import chat_response_format, chat_tools, renamed, to_messages


def where(i: int) -> str:
    return f"input.{i}"


def fc(call_id: str, name: str = "f", arguments: str = '{"a": 1}', **extra) -> dict:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments, **extra}


def out(call_id: str, output="ok") -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def test_a_turn_of_reasoning_message_and_calls_is_one_assistant_message():
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather "},
                                                        {"type": "input_text", "text": "in Rome?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Call."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking.",
                                                              "annotations": []}]},
        fc("c1", "get_weather", '{"city": "Rome"}'), fc("c2", "get_time", "{}"),
        out("c2", [{"type": "input_text", "text": "noon"}]), out("c1", "sunny"),
        {"role": "user", "content": "Thanks"},
    ]
    assert to_messages(items, where) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Call.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
            {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},  # the calls' order, not the outputs'
        {"role": "tool", "tool_call_id": "c2", "content": "noon"},
        {"role": "user", "content": "Thanks"},
    ]


def test_reasoning_before_a_call_starts_a_new_assistant_turn_and_summary_stands_in_for_content():
    items = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "First."},
             {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Then a call."}]}, fc("c1"), out("c1")]
    messages = to_messages(items, where)
    assert [m["role"] for m in messages] == ["user", "assistant", "assistant", "tool"]
    assert messages[2]["reasoning_content"] == "Then a call." and "content" not in messages[2]


def test_an_incomplete_call_is_left_out():
    items = [{"role": "user", "content": "x"}, fc("c1", status="incomplete"), {"role": "user", "content": "y"}]
    assert [m["role"] for m in to_messages(items, where)] == ["user", "user"]


@pytest.mark.parametrize(("items", "param"), [
    ([{"type": "message", "role": "user"}], "input.0.content"),
    ([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}], "input.0.content.0.type"),
    ([{"role": "user", "content": [5]}], "input.0.content.0.type"),
    ([fc("c1"), fc("c1")], "input.1.call_id"),
    ([fc("c1"), out("c1"), out("c1")], "input.2.call_id"),
    ([fc("c1", arguments={"a": 1})], "input.0.arguments"),
    ([{"type": "reasoning", "content": "thinking"}], "input.0.content"),
    ([{"content": "no role or type"}], "input.0.type"),
    ([fc("c1"), fc("c2"), out("c2")], "input"),
])
def test_bad_items_name_the_field(items, param):
    with pytest.raises(APIError) as info:
        to_messages(items, where)
    assert info.value.status == 400 and info.value.param == param


def test_tools_and_text_format_in_their_chat_forms():
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True, "description": None}
    assert chat_tools([tool]) == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"},
                                                                    "strict": True}}]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert chat_response_format({"type": "json_schema", "name": "A", "schema": schema, "strict": True}) == {
        "type": "json_schema", "json_schema": {"name": "A", "schema": schema, "strict": True}}
    assert chat_response_format({"type": "json_object"}) == {"type": "json_object"}


def test_chat_field_names_become_the_responses_ones():
    err = renamed(APIError("max_tokens=9 is too many", param="max_tokens", code="context_length_exceeded"))
    assert (err.param, err.message, err.code) == ("max_output_tokens", "max_output_tokens=9 is too many",
                                                  "context_length_exceeded")
    assert renamed(APIError("bad", param="response_format.json_schema.schema")).param == "text.format.schema"
    assert renamed(APIError("bad", param="tools.2.function.parameters")).param == "tools.2.parameters"
    assert renamed(APIError("bad", param="messages")).param == "input"
    assert renamed(APIError("bad", param="temperature")).param == "temperature"
