"""Jinja chat templates: our V3 / V3.1 fallbacks, checkpoint loading, and the sandbox."""

from __future__ import annotations

import json

import pytest

from dsa_runtime.errors import DSAError
from dsa_runtime.parsers.jinja_template import (
    ChatTemplateError,
    builtin_template,
    load_chat_template,
    render_chat_template,
)

B = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather for a city", "parameters": PARAMS},
    }
]
CONVERSATION = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "Weather in Paris and Tokyo?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {
                "id": "2",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Tokyo"}},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "2", "content": "rainy"},
    {"role": "assistant", "content": "Paris sunny, Tokyo rainy."},
    {"role": "user", "content": "Thanks"},
]
SHORT = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]


# ------------------------------------------------------------------------------------------------ V3.1

V31_TOOLS_SECTION = (
    "\n\n## Tools\nYou have access to the following tools:\n"
    "\n### get_weather\nDescription: Weather for a city\n\nParameters: " + json.dumps(PARAMS) + "\n"
    "\nIMPORTANT: to use tools, reply in exactly this format:\n"
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments<｜tool▁call▁end｜>"
    "{{additional_tool_calls}}<｜tool▁calls▁end｜>\n\n"
    "Where:\n"
    "- `tool_call_name` is exactly the name of one of the tools above\n"
    "- `tool_call_arguments` is a valid JSON object following that tool's Parameters schema\n"
    "- several calls follow each other directly, with nothing between them\n"
)


def test_v31_tool_conversation():
    prompt = render_chat_template(builtin_template("deepseek_v31"), CONVERSATION, tools=TOOLS)
    assert prompt == (
        B
        + "S"
        + V31_TOOLS_SECTION
        + "<｜User｜>Weather in Paris and Tokyo?<｜Assistant｜></think>"
        + "<｜tool▁calls▁begin｜>"
        + '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>'
        + '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Tokyo"}<｜tool▁call▁end｜>'
        + "<｜tool▁calls▁end｜>"
        + EOS
        + "<｜tool▁output▁begin｜>sunny<｜tool▁output▁end｜><｜tool▁output▁begin｜>rainy<｜tool▁output▁end｜>"
        + "Paris sunny, Tokyo rainy."
        + EOS
        + "<｜User｜>Thanks<｜Assistant｜></think>"
    )


@pytest.mark.parametrize(
    ("kwargs", "suffix"),
    [
        ({"thinking": True}, "<｜User｜>Hi<｜Assistant｜><think>"),
        ({"thinking": False}, "<｜User｜>Hi<｜Assistant｜></think>"),
        ({"enable_thinking": True}, "<｜User｜>Hi<｜Assistant｜><think>"),
        ({"thinking": True, "add_generation_prompt": False}, "<｜User｜>Hi"),
    ],
)
def test_v31_generation_prompt(kwargs, suffix):
    assert render_chat_template(builtin_template("deepseek_v31"), SHORT, **kwargs) == B + "S" + suffix


def test_v31_history_assistant_shows_no_reasoning():
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "reasoning_content": "secret", "content": "<think>also secret</think>answer"},
        {"role": "user", "content": "q2"},
    ]
    prompt = render_chat_template(builtin_template("deepseek_v31"), messages, thinking=True)
    assert (
        prompt == B + "<｜User｜>q<｜Assistant｜></think>answer" + EOS + "<｜User｜>q2<｜Assistant｜><think>"
    )


def test_v31_model_continues_after_tool_output():
    # Bug 4 (sglang #17761): the V3.1 format has no <｜Assistant｜> after tool output; we follow the format.
    prompt = render_chat_template(builtin_template("deepseek_v31"), CONVERSATION[:5], thinking=True)
    assert prompt.endswith("<｜tool▁output▁begin｜>rainy<｜tool▁output▁end｜>")


def test_v31_custom_bos_eos_and_content_parts():
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    prompt = render_chat_template(builtin_template("deepseek_v31"), messages, bos_token="", eos_token="</s>")
    assert prompt == "<｜User｜>ab<｜Assistant｜></think>"


# -------------------------------------------------------------------------------------------------- V3


def test_v3_tool_conversation():
    prompt = render_chat_template(builtin_template("deepseek_v3"), CONVERSATION, tools=TOOLS)
    tools_section = (
        "\n\n## Tools\n\n### Function\n\nYou have the following functions available:\n"
        "\n- `get_weather`:\n```json\n" + json.dumps(TOOLS[0]["function"]) + "\n```\n"
    )
    assert prompt.startswith(B + "S" + tools_section)
    body = prompt[prompt.index("<｜User｜>") :]
    assert body == (
        "<｜User｜>Weather in Paris and Tokyo?<｜Assistant｜>"
        "<｜tool▁calls▁begin｜>"
        '<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜>\n'
        '<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Tokyo"}\n```<｜tool▁call▁end｜>'
        "<｜tool▁calls▁end｜>" + EOS + "<｜tool▁outputs▁begin｜>"
        "<｜tool▁output▁begin｜>sunny<｜tool▁output▁end｜>\n<｜tool▁output▁begin｜>rainy<｜tool▁output▁end｜>"
        "<｜tool▁outputs▁end｜>"
        "Paris sunny, Tokyo rainy." + EOS + "<｜User｜>Thanks<｜Assistant｜>"
    )


@pytest.mark.parametrize(
    ("kwargs", "suffix"),
    [
        ({}, "<｜User｜>Hi<｜Assistant｜>"),
        ({"thinking": True}, "<｜User｜>Hi<｜Assistant｜><think>\n"),
        ({"add_generation_prompt": False}, "<｜User｜>Hi"),
    ],
)
def test_v3_generation_prompt(kwargs, suffix):
    assert render_chat_template(builtin_template("deepseek_v3"), SHORT, **kwargs) == B + "S" + suffix


def test_v3_strips_r1_reasoning_and_closes_tool_outputs():
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nanswer"},
        {"role": "user", "content": "q2"},
    ]
    prompt = render_chat_template(builtin_template("deepseek_v3"), messages)
    assert prompt == B + "<｜User｜>q<｜Assistant｜>\n\nanswer" + EOS + "<｜User｜>q2<｜Assistant｜>"
    ends_in_tool = render_chat_template(builtin_template("deepseek_v3"), CONVERSATION[:4])
    assert ends_in_tool.endswith("<｜tool▁output▁begin｜>sunny<｜tool▁output▁end｜><｜tool▁outputs▁end｜>")


def test_templates_reject_unknown_roles():
    for name in ("deepseek_v3", "deepseek_v31"):
        with pytest.raises(ChatTemplateError, match="unsupported role bot"):
            render_chat_template(builtin_template(name), [{"role": "bot", "content": "x"}])


def test_builtin_template_unknown_name():
    with pytest.raises(ChatTemplateError, match="deepseek_v31"):
        builtin_template("llama")


# ------------------------------------------------------------------------------------------ loading


def _write_config(tmp_path, value) -> None:
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "x", "chat_template": value}), encoding="utf-8"
    )


def test_load_string_template_from_checkpoint_dir(tmp_path):
    _write_config(tmp_path, "{{ bos_token }}{{ messages[0]['content'] }}")
    template = load_chat_template(tmp_path)
    assert render_chat_template(template, [{"role": "user", "content": "héllo"}]) == B + "héllo"


def test_load_named_templates_picks_default(tmp_path):
    _write_config(tmp_path, [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}])
    assert load_chat_template(str(tmp_path)) == "D"
    _write_config(tmp_path, [{"name": "tool_use", "template": "T"}])
    with pytest.raises(ChatTemplateError, match="no 'default' entry.*tool_use"):
        load_chat_template(tmp_path)


def test_chat_template_jinja_file_wins(tmp_path):
    _write_config(tmp_path, "from config")
    (tmp_path / "chat_template.jinja").write_text("from file", encoding="utf-8")
    assert load_chat_template(tmp_path) == "from file"


def test_missing_template_is_a_clear_error_or_the_fallback(tmp_path):
    with pytest.raises(ChatTemplateError, match="no chat template") as info:
        load_chat_template(tmp_path)
    assert isinstance(info.value, DSAError)
    (tmp_path / "tokenizer_config.json").write_text('{"bos_token": "x"}', encoding="utf-8")
    with pytest.raises(ChatTemplateError, match="V3.2 ships none"):
        load_chat_template(tmp_path)
    assert load_chat_template(tmp_path, fallback="deepseek_v31") == builtin_template("deepseek_v31")
    with pytest.raises(ChatTemplateError, match="not a checkpoint directory"):
        load_chat_template(tmp_path / "nope")
    (tmp_path / "tokenizer_config.json").write_text("{broken", encoding="utf-8")
    with pytest.raises(ChatTemplateError, match="cannot read"):
        load_chat_template(tmp_path)


# ------------------------------------------------------------------------------------ sandbox, helpers


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os }}",
        "{{ raise_exception.__globals__ }}",
        "{% set x = messages.append(1) %}",
        "{{ messages[0].update({'role': 'x'}) }}",
    ],
)
def test_sandbox_escape_attempts_raise(template):
    with pytest.raises(ChatTemplateError, match="sandbox"):
        render_chat_template(template, [{"role": "user", "content": "x"}])


def test_raise_exception_syntax_and_undefined_errors():
    with pytest.raises(ChatTemplateError, match="raised an error: Conversation roles must alternate"):
        render_chat_template("{{ raise_exception('Conversation roles must alternate') }}", [])
    with pytest.raises(ChatTemplateError, match="syntax error at line 2"):
        render_chat_template("ok\n{% if %}", [])
    with pytest.raises(ChatTemplateError, match="undefined"):
        render_chat_template("{{ nothing.here }}", [])
    with pytest.raises(ChatTemplateError, match="non-empty"):
        render_chat_template("", [])


def test_hf_style_template_features():
    template = (
        "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
        "{{ m.role }}:{{ m['content'] | tojson }};{% endfor %}"
        "{{ tools | tojson }}|{{ strftime_now('%Y') | length }}|{{ custom }}"
    )
    messages = [
        {"role": "user", "content": '<杭州> & "q"'},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "z"},
    ]
    prompt = render_chat_template(template, messages, tools=[{"name": "t"}], custom="kw")
    assert prompt == 'user:"<杭州> & \\"q\\"";assistant:"a";[{"name": "t"}]|4|kw'
