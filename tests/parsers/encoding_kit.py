"""Shared constants and message builders of the V3.2 encoder tests."""

from __future__ import annotations

B = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
FC = "<｜DSML｜function_calls>"
END_FC = "</｜DSML｜function_calls>"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _call(name: str, arguments) -> dict:
    return {"id": "call_x", "type": "function", "function": {"name": name, "arguments": arguments}}


# The conversation of the encoder vectors E1/E2.
E_MESSAGES = [
    {"role": "user", "content": "hello"},
    {"role": "assistant", "content": "Hello! I am DeepSeek.", "reasoning_content": "thinking..."},
    {"role": "user", "content": "1+1=?"},
]
