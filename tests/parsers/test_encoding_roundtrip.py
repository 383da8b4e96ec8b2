"""Round trips: the completion the encoder renders for an assistant turn parses back into that turn.

These are the golden round trips of ``tests/parsers/golden/README.md`` (messages[4] after the first four messages;
the assistant turn at index -6) plus edge-case values, through the output parser.
"""

from __future__ import annotations

import json

import pytest

from dsa_runtime.parsers import output
from dsa_runtime.parsers.encoding_v32 import encode_messages, render_assistant_completion


def _parse(text: str, thinking: bool = True):
    parser = output.OutputParser(tool_parser="deepseekv32", reasoning_parser="deepseek-v3", thinking=thinking)
    return parser.parse(text)


def _calls(parsed) -> list[tuple[str, object]]:
    return [(call.name, json.loads(call.arguments)) for call in parsed.tool_calls]


def _expected_calls(message: dict) -> list[tuple[str, object]]:
    out = []
    for call in message.get("tool_calls") or []:
        args = call["function"]["arguments"]
        out.append((call["function"]["name"], json.loads(args) if isinstance(args, str) else args))
    return out


def _round_trip(messages: list[dict], index: int):
    """Encode messages[index] after messages[:index] and parse the rendered turn back."""
    completion = encode_messages([messages[index]], context=messages[:index])
    assert completion == render_assistant_completion(messages[index])
    return _parse(completion)


def test_golden_round_trip_tool_call_turn(golden_messages):
    message = golden_messages[4]
    parsed = _round_trip(golden_messages, 4)
    assert _calls(parsed) == _expected_calls(message)
    assert parsed.reasoning_content == message["reasoning_content"]
    assert parsed.content in (None, "")
    assert parsed.finish_reason == "tool_calls"


def test_golden_round_trip_single_call_turn(golden_messages):
    # The README calls messages[4] "an assistant turn with one tool call"; in the data that is messages[2].
    parsed = _round_trip(golden_messages, 2)
    assert _calls(parsed) == [("get_datetime", {"timezone": "Asia/Shanghai"})]


def test_golden_round_trip_reasoning_and_content_turn(golden_messages):
    index = len(golden_messages) - 6
    message = golden_messages[index]
    assert message.get("reasoning_content") and message.get("content")
    parsed = _round_trip(golden_messages, index)
    assert parsed.reasoning_content == message["reasoning_content"]
    assert parsed.content == message["content"]
    assert parsed.tool_calls == []
    assert parsed.finish_reason == "stop"


def test_every_golden_assistant_turn_round_trips(golden_messages):
    for index, message in enumerate(golden_messages):
        if message["role"] != "assistant":
            continue
        parsed = _round_trip(golden_messages, index)
        assert _calls(parsed) == _expected_calls(message), index
        assert (parsed.content or "") == (message.get("content") or ""), index
        assert parsed.reasoning_content == message["reasoning_content"], index


EDGE_ARGUMENTS = {
    "text": 'line1\nline2 "quoted" <tag> & 5 < 6',
    "city": "杭州🌤️",
    "zip": "02139",
    "n": 10,
    "ratio": -2.5,
    "flag": False,
    "none": None,
    "ids": [1, 2, 3],
    "filters": {"tags": ["a", "b"], "range": {"min": 1, "max": 5}, "名": "值"},
}


@pytest.mark.parametrize("thinking", [True, False])
def test_edge_values_zero_args_and_content_round_trip(thinking):
    message = {
        "role": "assistant",
        "reasoning_content": "需要调用工具📅" if thinking else None,
        "content": "Let me check.",
        "tool_calls": [
            {"type": "function", "function": {"name": "emit", "arguments": json.dumps(EDGE_ARGUMENTS)}},
            {"type": "function", "function": {"name": "get_time", "arguments": "{}"}},
        ],
    }
    mode = "thinking" if thinking else "chat"
    parsed = _parse(render_assistant_completion(message, mode), thinking=thinking)
    assert _calls(parsed) == [("emit", EDGE_ARGUMENTS), ("get_time", {})]
    assert list(json.loads(parsed.tool_calls[0].arguments)) == list(EDGE_ARGUMENTS)  # key order kept
    assert parsed.content == "Let me check."
    assert parsed.reasoning_content == message["reasoning_content"]
