"""DeepSeek-V3.2 chat encoder: the upstream bugs of docs/parsers.md it guards against (4, 15, 16, 17)."""

from __future__ import annotations

import time

import pytest

from dsa_runtime.parsers.encoding_v32 import EncodingError, encode_messages
from tests.parsers.encoding_kit import E_MESSAGES, EOS, FC, WEATHER_TOOL, B, _call

# ---------------------------------------------------------------------------------------------- bug 4


def test_bug4_no_assistant_token_after_tool_results(golden):
    # V3.2's trained format continues the same assistant turn after <function_results> (the golden shows
    # it); <｜Assistant｜> only ever follows a user/developer message.
    data, expected = golden
    users = sum(1 for m in data["messages"] if m["role"] in ("user", "developer"))
    assert expected.count("<｜Assistant｜>") == users
    assert "</function_results><｜Assistant｜>" not in expected
    assert "</function_results>\n\n</think>\n\n" + FC in expected
    assert "</function_results>\n\n<think>" in expected


# --------------------------------------------------------------------------------------------- bug 15


def test_bug15_request_tools_follow_an_existing_system_prompt():
    messages = [{"role": "system", "content": "You are S."}, {"role": "user", "content": "q"}]
    prompt = encode_messages(messages, "chat", tools=[WEATHER_TOOL])
    assert prompt.startswith(B + "You are S.\n\n## Tools\n\n")
    assert prompt.count("## Tools") == 1
    assert prompt.count("You are S.") == 1
    assert messages[0] == {"role": "system", "content": "You are S."}  # caller's dict untouched


def test_bug15_request_tools_without_system_render_as_empty_system():
    user = {"role": "user", "content": "q"}
    with_keyword = encode_messages([user], "chat", tools=[WEATHER_TOOL])
    as_empty_system = encode_messages([{"role": "system", "content": ""}, user], "chat", tools=[WEATHER_TOOL])
    on_first_message = encode_messages([{**user, "tools": [WEATHER_TOOL]}], "chat")
    assert with_keyword == as_empty_system == on_first_message
    assert with_keyword.startswith(B + "\n\n## Tools\n\n")
    assert with_keyword.endswith("</functions>\n<｜User｜>q<｜Assistant｜></think>")


def test_bug15_tools_given_twice_or_on_wrong_messages_are_errors():
    system = {"role": "system", "content": "S", "tools": [WEATHER_TOOL]}
    with pytest.raises(EncodingError, match="given twice"):
        encode_messages([system], tools=[WEATHER_TOOL])
    with pytest.raises(EncodingError, match="message 1 \\(assistant\\)"):
        encode_messages(
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "tools": [WEATHER_TOOL]}]
        )
    with pytest.raises(EncodingError, match="context"):
        encode_messages([{"role": "user", "content": "q"}], context=[system], tools=[WEATHER_TOOL])


# --------------------------------------------------------------------------------------------- bug 16


def test_bug16_continue_final_message_leaves_the_turn_open():
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, wor"}]
    assert encode_messages(history, "chat", continue_final_message=True) == (
        f"{B}<｜User｜>Hi<｜Assistant｜></think>Hello, wor"
    )
    prefixed = [history[0], {**history[1], "prefix": True}]
    assert encode_messages(prefixed, "chat") == encode_messages(history, "chat", continue_final_message=True)
    # Without it, an assistant-terminated history is a complete conversation (the golden ends like this).
    assert encode_messages(history, "chat").endswith("Hello, wor" + EOS)


def test_bug16_continue_final_message_in_thinking_mode():
    still_thinking = [{"role": "user", "content": "Hi"}, {"role": "assistant", "reasoning_content": "Let me"}]
    assert encode_messages(still_thinking, continue_final_message=True).endswith(
        "<｜Assistant｜><think>Let me"
    )
    answering = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "reasoning_content": "R", "content": "Part"},
    ]
    assert encode_messages(answering, continue_final_message=True).endswith("<think>R</think>Part")


def test_bug16_add_generation_prompt_false_omits_only_the_final_opener(golden):
    user_last = encode_messages(E_MESSAGES, add_generation_prompt=False)
    assert user_last.endswith("<｜User｜>1+1=?")
    assert "</think>Hello!" in user_last  # mid-conversation openers stay
    data, expected = golden
    tool_last = encode_messages(data["messages"][:-1], add_generation_prompt=False)
    assert tool_last.endswith("</result>\n</function_results>")
    assert expected.startswith(tool_last)


def test_bug16_continue_needs_a_final_assistant_message():
    with pytest.raises(EncodingError, match="continue_final_message"):
        encode_messages(E_MESSAGES, continue_final_message=True)
    calls = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [_call("f", "{}")]}]
    with pytest.raises(EncodingError, match="tool_calls"):
        encode_messages(calls, continue_final_message=True)


# --------------------------------------------------------------------------------------------- bug 17


class _CountingMessage(dict):
    """A message that counts every field read, to measure the encoder's work per message."""

    reads = 0

    def __getitem__(self, key):
        _CountingMessage.reads += 1
        return super().__getitem__(key)

    def get(self, key, default=None):
        _CountingMessage.reads += 1
        return super().get(key, default)


def _tool_conversation(n: int, cls=dict) -> list[dict]:
    calls = [_call("get_weather", {"city": f"c{i}"}) for i in range(n)]
    messages = [
        {"role": "system", "content": "S", "tools": [WEATHER_TOOL]},
        {"role": "user", "content": "weather everywhere"},
        {"role": "assistant", "reasoning_content": "many calls", "tool_calls": calls},
    ]
    messages += [{"role": "tool", "tool_call_id": None, "content": f"r{i}"} for i in range(n)]
    messages.append({"role": "assistant", "reasoning_content": "done", "content": "ok"})
    return [cls(m) for m in messages]


def test_bug17_tool_messages_are_grouped_in_linear_work():
    def reads(n: int) -> int:
        _CountingMessage.reads = 0
        encode_messages(_tool_conversation(n, _CountingMessage))
        return _CountingMessage.reads

    small, large = reads(200), reads(2000)
    # A backward rescan per tool message would read ~n^2/2 fields (100x for 10x messages).
    assert large < 11 * small
    assert large < 20 * 2000


def test_bug17_large_tool_conversation_encodes_fast():
    messages = _tool_conversation(20000)
    start = time.perf_counter()
    prompt = encode_messages(messages)
    assert time.perf_counter() - start < 2.0
    assert prompt.count("<result>") == 20000
    assert prompt.count("\n\n<function_results>\n<result>") == 1
