"""tool_choice resolution and the forced openings: the bytes of each format's training layout, parsed back."""

from __future__ import annotations

import json
import random

import pytest

from dsa_runtime.errors import ConfigError
from dsa_runtime.parsers import OutputParser
from dsa_runtime.parsers.encoding_v32 import encode_messages, render_assistant_completion
from dsa_runtime.parsers.jinja_template import builtin_template, render_chat_template
from dsa_runtime.parsers.tool_choice import ToolChoiceError, forced_opening, resolve_tool_choice

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
TIME = {"type": "function", "function": {"name": "get_datetime", "description": "now"}}
BARE = {"name": "lookup", "parameters": {}}
NAMES = ["get_weather", "f", "名前_ツール", "a.b-c_9"]
FORMATS = ["deepseekv32", "deepseekv31", "deepseekv3"]


def _call_message(name: str, arguments: dict) -> dict:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}


@pytest.mark.parametrize("name", NAMES)
def test_dsml_opening_is_how_the_encoder_writes_a_call_reply(name):
    args = {"city": "Paris", "days": 3}
    completion = render_assistant_completion(_call_message(name, args), "chat")
    assert completion.startswith(forced_opening("deepseekv32", name))
    assert completion.startswith(forced_opening("deepseekv32", None))
    assert forced_opening("deepseekv32", name).endswith(f'<｜DSML｜invoke name="{name}">\n')
    # In a whole conversation the opening follows the chat-mode generation prompt, as the prompt + forced text.
    convo = [{"role": "user", "content": "hi"}, _call_message(name, args)]
    prompt = encode_messages(convo[:1], "chat", tools=[WEATHER])
    assert encode_messages(convo, "chat", tools=[WEATHER]).startswith(prompt + forced_opening("deepseekv32", name))


@pytest.mark.parametrize("template,fmt,opener", [
    ("deepseek_v31", "deepseekv31", "<｜Assistant｜></think>"),
    ("deepseek_v3", "deepseekv3", "<｜Assistant｜>"),
])
@pytest.mark.parametrize("name", NAMES)
def test_token_openings_are_how_the_templates_write_a_call_reply(template, fmt, opener, name):
    source = builtin_template(template)
    user = [{"role": "user", "content": "hi"}]
    prompt = render_chat_template(source, user, tools=[WEATHER])
    assert prompt.endswith(opener)
    full = render_chat_template(source, user + [_call_message(name, {"x": [1, "y"]})], tools=[WEATHER],
                                add_generation_prompt=False)
    assert full.startswith(prompt + forced_opening(fmt, name))
    assert full.startswith(prompt + forced_opening(fmt, None))


def _chunks(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, 7))) if len(text) > 1 else []
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


CONTINUATIONS = {  # what the model writes after a named opening (arguments {"city": "Paris", "n": 2})
    "deepseekv32": '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
                   '<｜DSML｜parameter name="n" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
                   "</｜DSML｜function_calls><｜end▁of▁sentence｜>",
    "deepseekv31": '{"city": "Paris", "n": 2}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>',
    "deepseekv3": '{"city": "Paris", "n": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>',
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", NAMES)
def test_opening_then_generated_text_parses_to_the_named_call_for_any_chunking(fmt, name):
    rng = random.Random(f"{fmt}{name}")
    opening = forced_opening(fmt, name)
    results = []
    for _ in range(4):
        stream = OutputParser(fmt, "deepseek-v3").stream()
        deltas = stream.feed(opening)
        # A named opening already names the call: its header goes out before any generated text.
        assert [tc.name for d in deltas for tc in d.tool_calls] == [name]
        for piece in _chunks(CONTINUATIONS[fmt], rng):
            deltas += stream.feed(piece)
        tail, reason = stream.finish()
        from dsa_runtime.parsers.stream import collect

        parsed = collect(deltas + tail, reason, stream.completed_calls)
        results.append([(c.name, c.arguments) for c in parsed.tool_calls])
        assert (parsed.content, parsed.reasoning_content, reason) == (None, None, "tool_calls")
    assert all(r == results[0] for r in results)
    ((got, arguments),) = results[0]
    assert (got, json.loads(arguments)) == (name, {"city": "Paris", "n": 2})


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_named_opening_alone_is_a_call_with_empty_arguments_unless_truncated(fmt):
    opening = forced_opening(fmt, "get_weather")
    parsed = OutputParser(fmt, "deepseek-v3").parse(opening)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("get_weather", "{}")]
    assert parsed.finish_reason == "tool_calls"
    cut = OutputParser(fmt, "deepseek-v3").parse(opening, truncated=True)
    assert (cut.tool_calls, cut.finish_reason) == ([], "length")


@pytest.mark.parametrize("fmt,call", [
    ("deepseekv32", '<｜DSML｜invoke name="get_datetime">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>'),
    ("deepseekv31", "<｜tool▁call▁begin｜>get_datetime<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    ("deepseekv3", "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_datetime\n```json\n{}\n```<｜tool▁call▁end｜>"),
])
def test_required_opening_lets_the_model_pick_the_function(fmt, call):
    opening = forced_opening(fmt, None)
    assert "get_datetime" not in opening
    parsed = OutputParser(fmt, "deepseek-r1").parse(opening + call)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("get_datetime", "{}")]
    assert (parsed.content, parsed.reasoning_content) == (None, None)


def test_resolution_of_each_mode():
    auto = resolve_tool_choice([WEATHER, TIME], None, "deepseekv32")
    assert (auto.mode, auto.tools, auto.forced, auto.parse_calls) == ("auto", [WEATHER, TIME], "", True)
    assert resolve_tool_choice(None, None, "deepseekv32").mode == "none"
    none = resolve_tool_choice([WEATHER], "none", "deepseekv32")
    assert (none.tools, none.forced, none.parse_calls) == (None, "", False)
    required = resolve_tool_choice([WEATHER, TIME], "required", "deepseek_v31")  # an alias
    assert (required.tools, required.forced) == ([WEATHER, TIME], "<｜tool▁calls▁begin｜>")
    named = resolve_tool_choice([WEATHER, BARE, TIME], {"type": "function", "function": {"name": "lookup"}},
                                "deepseekv3")
    assert (named.mode, named.tools, named.function) == ("named", [BARE], "lookup")
    assert named.forced == forced_opening("deepseekv3", "lookup")
    # A forced reply is written without reasoning; others keep what was asked.
    assert (named.thinking(True), required.thinking(True), auto.thinking(True), auto.thinking(False)) == (
        False, False, True, False)


@pytest.mark.parametrize("tools,choice,match", [
    ([WEATHER], "always", "must be 'none', 'auto', 'required' or a named function"),
    ([WEATHER], {"type": "function", "function": {"name": ""}}, "named tool_choice must be"),
    ([WEATHER], {"type": "tool", "function": {"name": "get_weather"}}, "named tool_choice must be"),
    ([WEATHER], {"function": "get_weather"}, "named tool_choice must be"),
    ([WEATHER], ["required"], "named tool_choice must be"),
    ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "'nope', which is not in 'tools'"),
    (None, "required", "needs 'tools'"),
    ([], "auto", "needs 'tools'"),
    (None, {"type": "function", "function": {"name": "get_weather"}}, "not in 'tools'"),
])
def test_bad_tool_choices_are_one_line_errors(tools, choice, match):
    with pytest.raises(ToolChoiceError, match=match):
        resolve_tool_choice(tools, choice, "deepseekv32")


def test_unknown_call_format_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown tool parser"):
        resolve_tool_choice([WEATHER], "required", "hermes")
