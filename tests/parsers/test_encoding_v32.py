"""DeepSeek-V3.2 chat encoder: golden prompt, encoding rules, vectors E1/E2, and the upstream bugs it guards."""

from __future__ import annotations

import copy
import json

import pytest

from dsa_runtime.errors import DSAError
from dsa_runtime.parsers.encoding_v32 import (
    EncodingError,
    encode_messages,
    function_schemas,
    render_assistant_completion,
    render_tool_calls,
)
from dsa_runtime.parsers.tools_prompt_v32 import TOOLS_PREAMBLE, render_tools_block
from tests.parsers.encoding_kit import E_MESSAGES, END_FC, EOS, FC, WEATHER_TOOL, B, _call

# ------------------------------------------------------------------------------------------------ golden


def test_golden_prompt_byte_exact(golden):
    data, expected = golden
    assert encode_messages(data["messages"], thinking_mode="thinking") == expected


def test_golden_prompt_with_tools_keyword_is_the_same(golden):
    data, expected = golden
    messages = copy.deepcopy(data["messages"])
    del messages[0]["tools"]
    assert encode_messages(messages, "thinking", tools=data["tools"]) == expected


def test_golden_input_is_not_mutated(golden):
    data, _ = golden
    before = copy.deepcopy(data["messages"])
    encode_messages(data["messages"], tools=None)
    encode_messages([m for m in before if m["role"] != "system"], tools=data["tools"])
    assert data["messages"] == before


def test_bug24_tools_block_text_byte_exact_including_blank_lines(golden):
    data, expected = golden
    start = expected.index("## Tools")
    end = expected.index("</functions>\n") + len("</functions>\n")
    assert render_tools_block(function_schemas(data["tools"])) == expected[start:end]
    # The blank lines a port once collapsed: after the heading, around each example, before the list.
    preamble_lines = TOOLS_PREAMBLE.split("\n")
    assert preamble_lines[:2] == ["## Tools", ""]
    assert preamble_lines.count("") == 8  # 7 blank lines + the empty string after the final newline
    assert "</function_results>\n\n<think>...thinking about results</think>\n\nHere are" in TOOLS_PREAMBLE


# ------------------------------------------------------------------------------------------- vectors E1/E2



def test_vector_e1_thinking():
    assert encode_messages(E_MESSAGES, thinking_mode="thinking") == (
        f"{B}<｜User｜>hello<｜Assistant｜></think>Hello! I am DeepSeek.{EOS}<｜User｜>1+1=?<｜Assistant｜><think>"
    )


def test_vector_e2_chat():
    assert encode_messages(E_MESSAGES, thinking_mode="chat") == (
        f"{B}<｜User｜>hello<｜Assistant｜></think>Hello! I am DeepSeek.{EOS}<｜User｜>1+1=?<｜Assistant｜></think>"
    )


def test_no_bos_option_and_no_bos_with_context():
    assert not encode_messages(E_MESSAGES, add_default_bos_token=False).startswith(B)
    assert not encode_messages(E_MESSAGES[2:], context=E_MESSAGES[:2]).startswith(B)
    assert encode_messages(E_MESSAGES, context=[]).startswith(B)  # an empty context is no context


# ------------------------------------------------------------------------------------- incremental context


def test_incremental_encoding_equals_suffix_of_full_encoding(golden):
    data, expected = golden
    messages = data["messages"]
    for k in range(1, len(messages)):
        part = encode_messages(messages[k:], context=messages[:k])
        assert not part.startswith(B)
        assert expected.endswith(part), k


def test_agent_loop_increments_within_the_last_turn_concatenate_to_full(golden):
    # Within the final user turn nothing earlier changes, so prefix + increment is the whole prompt.
    data, expected = golden
    messages = data["messages"]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    for k in range(last_user + 1, len(messages)):
        assert (
            encode_messages(messages[:k]) + encode_messages(messages[k:], context=messages[:k]) == expected
        ), k


def test_message_by_message_encoding_with_kept_thinking_concatenates_to_full(golden):
    data, _ = golden
    messages = data["messages"]
    pieces = [encode_messages([m], context=messages[:i], drop_thinking=False) for i, m in enumerate(messages)]
    assert "".join(pieces) == encode_messages(messages, drop_thinking=False)


def test_context_indices_decide_the_think_suffix():
    # The last user is in `messages`, so the context's user gets </think> in the full encoding; encoding
    # only the tail must still see it as the last user turn.
    tail = encode_messages(E_MESSAGES[2:], context=E_MESSAGES[:2])
    assert tail == "<｜User｜>1+1=?<｜Assistant｜><think>"


# ------------------------------------------------------------------------------- chat vs thinking, thinking


def test_chat_mode_golden_shows_no_reasoning_and_never_opens_think(golden):
    data, _ = golden
    prompt = encode_messages(data["messages"], thinking_mode="chat")
    assert prompt.count("<think>") == 1  # only the tools block's example
    for m in data["messages"]:
        if m.get("reasoning_content"):
            assert m["reasoning_content"] not in prompt
    assert prompt.endswith(data["messages"][-1]["content"] + EOS)
    assert "</function_results>\n\n</think>" in prompt


def test_thinking_mode_shows_reasoning_only_after_last_user(golden):
    data, expected = golden
    messages = data["messages"]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    for i, m in enumerate(messages):
        if m.get("reasoning_content"):
            assert (m["reasoning_content"] in expected) == (i > last_user), i
    assert expected.count("<think>") == 3  # last user opener, last tool group opener, tools-block example
    assert "</function_results>\n\n<think>" in expected


def test_drop_thinking_false_keeps_earlier_reasoning_and_is_append_only(golden):
    data, _ = golden
    messages = data["messages"]
    kept = encode_messages(messages, drop_thinking=False)
    for m in messages:
        if m.get("reasoning_content"):
            assert m["reasoning_content"] + "</think>" in kept
    assert "<｜Assistant｜></think>" not in kept
    for k in range(1, len(messages) + 1):
        assert kept.startswith(encode_messages(messages[:k], drop_thinking=False)), k


def test_drop_thinking_true_is_not_append_only_across_user_turns(golden):
    data, expected = golden
    first_turn = encode_messages(data["messages"][:2])
    assert first_turn.endswith("<｜Assistant｜><think>")
    assert not expected.startswith(first_turn)


def test_drop_thinking_has_no_effect_in_chat_mode(golden):
    data, _ = golden
    assert encode_messages(data["messages"], "chat", drop_thinking=False) == encode_messages(
        data["messages"], "chat"
    )


def test_reasoning_key_alias():
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "reasoning": "r", "content": "a"}]
    assert encode_messages(messages).endswith("<think>r</think>a" + EOS)


# ---------------------------------------------------------------------------- developer, response_format


def test_developer_role_search_agent_variant():
    messages = [{"role": "developer", "content": "Find X", "tools": [WEATHER_TOOL]}]
    tools_block = render_tools_block(function_schemas([WEATHER_TOOL]))
    assert encode_messages(messages) == (
        f"{B}<｜User｜>\n\n{tools_block}\n\n# The user's message is: Find X<｜Assistant｜><think>"
    )
    assert "</functions>\n\n\n# The user's message is: Find X" in encode_messages(messages)
    assert encode_messages(messages, "chat").endswith("<｜Assistant｜></think>")


def test_developer_counts_as_user_turn_for_reasoning():
    messages = [
        {"role": "developer", "content": "Q1"},
        {"role": "assistant", "reasoning_content": "old", "content": "A1"},
        {"role": "developer", "content": "Q2"},
        {"role": "assistant", "reasoning_content": "new", "content": "A2"},
    ]
    prompt = encode_messages(messages)
    assert "old" not in prompt
    assert prompt.endswith("# The user's message is: Q2<｜Assistant｜><think>new</think>A2" + EOS)


def test_response_format_on_system_and_developer_and_keyword():
    schema = {"type": "object", "properties": {"answer": {"type": "string", "description": "réponse"}}}
    section = (
        "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
        + json.dumps(schema, ensure_ascii=False)
    )
    system = [{"role": "system", "content": "S", "response_format": schema}, {"role": "user", "content": "q"}]
    assert encode_messages(system, "chat") == f"{B}S\n\n{section}<｜User｜>q<｜Assistant｜></think>"
    keyword = encode_messages(
        [system[0] | {"response_format": None}, system[1]], "chat", response_format=schema
    )
    assert keyword == encode_messages(system, "chat")
    both = encode_messages([{**system[0], "tools": [WEATHER_TOOL]}, system[1]], "chat")
    assert "</functions>\n\n\n## Response Format:" in both  # the tools block ends in a newline
    developer = [{"role": "developer", "content": "q", "response_format": schema}]
    assert (
        encode_messages(developer)
        == f"{B}<｜User｜>\n\n{section}\n\n# The user's message is: q<｜Assistant｜><think>"
    )
    assert "réponse" in encode_messages(system)


def test_system_without_content_and_content_parts():
    assert encode_messages([{"role": "system"}, {"role": "user", "content": "q"}], "chat") == (
        f"{B}<｜User｜>q<｜Assistant｜></think>"
    )
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert (
        encode_messages([{"role": "user", "content": parts}], "chat")
        == f"{B}<｜User｜>ab<｜Assistant｜></think>"
    )


# --------------------------------------------------------------------------------- tool calls and values


@pytest.mark.parametrize("arguments", ["{}", "", "  ", None, {}])
def test_zero_argument_call(arguments):
    block = render_tool_calls([_call("get_time", arguments)])
    assert block == f'{FC}\n<｜DSML｜invoke name="get_time">\n\n</｜DSML｜invoke>\n{END_FC}'


def test_value_encoding_strings_raw_others_json():
    args = {
        "text": 'line1\nline2 "quoted" <tag> & 5 < 6',
        "city": "杭州🌤️",
        "zip": "02139",
        "empty": "",
        "n": 10,
        "ratio": -2.5,
        "flag": True,
        "none": None,
        "ids": [1, 2, 3],
        "filters": {"tags": ["a", "b"], "名": "值"},
    }
    block = render_tool_calls([_call("f", args)])
    p = '<｜DSML｜parameter name="{}" string="{}">{}</｜DSML｜parameter>'
    assert block == "\n".join(
        [
            FC,
            '<｜DSML｜invoke name="f">',
            p.format("text", "true", 'line1\nline2 "quoted" <tag> & 5 < 6'),
            p.format("city", "true", "杭州🌤️"),
            p.format("zip", "true", "02139"),
            p.format("empty", "true", ""),
            p.format("n", "false", "10"),
            p.format("ratio", "false", "-2.5"),
            p.format("flag", "false", "true"),
            p.format("none", "false", "null"),
            p.format("ids", "false", "[1, 2, 3]"),
            p.format("filters", "false", '{"tags": ["a", "b"], "名": "值"}'),
            "</｜DSML｜invoke>",
            END_FC,
        ]
    )
    # Arguments given as JSON text render the same as the mapping (key order kept).
    assert render_tool_calls([_call("f", json.dumps(args))]) == block


def test_parallel_calls_share_one_block_and_flat_calls_are_accepted():
    block = render_tool_calls([{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": "{}"}])
    assert block.count(FC) == 1
    assert '</｜DSML｜invoke>\n<｜DSML｜invoke name="b">' in block


def test_assistant_content_then_tool_calls_separated_by_blank_line():
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [_call("get_time", "{}")]},
    ]
    prompt = encode_messages(messages, "chat")
    assert prompt.endswith(
        f"</think>Let me check.\n\n{FC}\n"
        + '<｜DSML｜invoke name="get_time">\n\n</｜DSML｜invoke>\n'
        + END_FC
        + EOS
    )


# --------------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("messages", "kwargs", "pattern"),
    [
        (
            [{"role": "user", "content": "q"}, {"role": "bot", "content": "x"}],
            {},
            r"messages\[1\]: unknown role 'bot'",
        ),
        ([{"content": "x"}], {}, r"messages\[0\]: unknown role None"),
        (["hello"], {}, r"messages\[0\] is not a message object"),
        ([{"role": "user"}], {}, r"message 0 \(user\): missing 'content'"),
        ([{"role": "user", "content": 3}], {}, r"message 0 \(user\): 'content' must be a string"),
        ([{"role": "developer", "content": ""}], {}, r"message 0 \(developer\): .*non-empty"),
        (
            [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}],
            {},
            r"message 1 \(tool\): tool result with no",
        ),
        (
            [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [_call("f", "{}")]}]
            + [{"role": "tool", "content": "r"}] * 2,
            {},
            r"message 3 \(tool\): more tool results than the 1 tool call",
        ),
        (
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "tool_calls": [_call("f", "{}"), _call("g", "{}")]},
            ]
            + [{"role": "tool", "content": "r"}, {"role": "user", "content": "q2"}],
            {"thinking_mode": "chat"},
            r"message 3 \(user\): message 1 made 2 tool calls but only 1",
        ),
        (
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "tool_calls": [_call("f", "{}")]},
                {"role": "tool"},
            ],
            {},
            r"message 2 \(tool\): missing 'content'",
        ),
        (
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            {"thinking_mode": "thinking"},
            r"message 1 \(assistant\): in thinking mode .* needs 'reasoning_content' or 'tool_calls'",
        ),
        (
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "tool_calls": [_call("f", "{not json")]},
            ],
            {},
            r"message 1 \(assistant\) tool_calls\[0\] \(f\): arguments are not valid JSON",
        ),
        (
            [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [_call("f", "[1]")]}],
            {},
            r"arguments must be a JSON object",
        ),
        (
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]},
            ],
            {},
            r"missing function 'name'",
        ),
        ([{"role": "user", "content": "q"}], {"thinking_mode": "think"}, r"thinking_mode must be one of"),
        (
            [{"role": "system", "content": "S", "tools": [{"type": "function"}]}],
            {},
            r"a tool needs a 'function'",
        ),
    ],
)
def test_invalid_input_raises_encoding_error_naming_the_message(messages, kwargs, pattern):
    with pytest.raises(EncodingError, match=pattern) as info:
        encode_messages(messages, **kwargs)
    assert isinstance(info.value, DSAError)


def test_context_messages_count_in_error_indices():
    with pytest.raises(EncodingError, match=r"message 3 \(tool\)"):
        encode_messages([{"role": "tool", "content": "r"}], context=E_MESSAGES)


def test_messages_must_be_a_list():
    with pytest.raises(EncodingError, match="messages must be a list"):
        encode_messages("hello")  # type: ignore[arg-type]


def test_assistant_after_last_user_in_chat_mode_needs_no_reasoning():
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert encode_messages(messages, "chat").endswith("<｜Assistant｜></think>a" + EOS)


# ------------------------------------------------------------------------------------ assistant completion


def test_render_assistant_completion_matches_the_encoded_turn(golden):
    data, _ = golden
    messages = data["messages"]
    for i in (2, 4, 7, 9, 12):
        assert messages[i]["role"] == "assistant"
        assert encode_messages([messages[i]], context=messages[:i]) == render_assistant_completion(
            messages[i]
        ), i
    assert render_assistant_completion(messages[-1], "chat") == messages[-1]["content"] + EOS
    assert render_assistant_completion({"role": "assistant", "content": "x"}) == "</think>x" + EOS
    with pytest.raises(EncodingError):
        render_assistant_completion({"role": "user", "content": "x"})
