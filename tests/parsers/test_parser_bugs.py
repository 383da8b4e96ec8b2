"""One test per upstream bug of docs/parsers.md that concerns output parsing (4, 15, 16, 17, 24 are encoder-side).

Each test names the bug number and the upstream issue it reproduces.
"""

from __future__ import annotations

import json

from dsa_runtime.parsers import OutputParser
from dsa_runtime.parsers.types import Delta, ParsedOutput
from tests.parsers.parser_kit import (
    CALL_BEGIN,
    CALL_END,
    CALLS_BEGIN,
    CALLS_END,
    EOS,
    FC,
    FCE,
    IE,
    PE,
    SEP,
    D,
    I,
    P,
    assert_same_everywhere,
    calls_of,
    check_deltas,
    chunked,
    dsml_block,
    stream,
    v31_block,
)

V32 = OutputParser("deepseekv32")
V32_THINK = OutputParser("deepseekv32", "deepseek-v3", thinking=True)
WEATHER = [("get_weather", {"location": "Paris", "days": 3})]


def _arg_fragments(deltas: list[Delta]) -> list[str]:
    return [tc.arguments for d in deltas for tc in d.tool_calls if tc.id is None and tc.arguments]


def test_bug01_block_opened_before_think_end_sglang_21179():
    text = "I should look up the weather.\n\n" + dsml_block(WEATHER) + EOS
    out = V32_THINK.parse(text)
    assert out.reasoning_content == "I should look up the weather."
    assert out.content is None and calls_of(out) == WEATHER
    assert_same_everywhere(V32_THINK, text)


def test_bug02_malformed_partial_json_string_false_sglang_21546():
    text = f"{FC}\n{I('search')}\n{P('query', 'false')}Привет, как дела? {{не json{PE}\n{IE}\n{FCE}"
    for chunks in ([text], chunked(text, 1), chunked(text, 3)):
        per_feed, deltas, out = stream(V32, chunks)
        check_deltas(deltas)  # no raw DSML leaked as content
        assert calls_of(out) == [("search", {"query": "Привет, как дела? {не json"})]
        assert out.content is None
        # Nothing re-emitted: the argument fragments concatenate to exactly one JSON object.
        assert json.loads("".join(_arg_fragments(deltas))) == {"query": "Привет, как дела? {не json"}


def test_bug03_tags_without_dsml_prefix_or_mixed_sglang_14332():
    plain = (
        'OK.\n\n<function_calls>\n<invoke name="get_weather">\n<parameter name="location" string="true">Paris'
        '</parameter>\n<parameter name="days" string="false">3</parameter>\n</invoke>\n</function_calls>'
    )
    mixed = (
        f'OK.\n\n{FC}\n<invoke name="get_weather">\n{P("location", "true")}Paris</parameter>\n'
        f'<parameter name="days" string="false">3{PE}\n{IE}\n</function_calls>'
    )
    for text in (plain, mixed):
        out = V32.parse(text)
        assert (out.content, calls_of(out)) == ("OK.", WEATHER)
        assert_same_everywhere(V32, text)


def test_bug05_v31_format_with_dsml_parser_sglang_17141():
    """A V3.2-Exp model (or a V3.1 template) emits V3.1 tokens; the DSML parser still finds the calls."""
    text = "Checking." + v31_block(WEATHER) + EOS
    out = V32.parse(text)
    assert (out.content, calls_of(out), out.finish_reason) == ("Checking.", WEATHER, "tool_calls")
    assert_same_everywhere(V32, text)


def test_bug06_v31_parser_on_v32_output_vllm_26897():
    parser = OutputParser("deepseekv31")
    text = "Checking.\n\n" + dsml_block(WEATHER) + EOS
    out = parser.parse(text)
    assert (out.content, calls_of(out)) == ("Checking.", WEATHER)
    assert all(isinstance(json.loads(c.arguments), dict) for c in out.tool_calls)  # never "{{xxx}"
    assert_same_everywhere(parser, text)


def test_bug07_answer_after_tool_results_is_content_sglang_17551():
    # Chat mode: the prompt after tool results ends in </think>; everything is the answer.
    chat = OutputParser("deepseekv32", "deepseek-v3", thinking=False)
    out = chat.parse("It is sunny in Paris." + EOS)
    assert (out.content, out.reasoning_content) == ("It is sunny in Paris.", None)
    # Thinking mode: the prompt ends in <think>; the answer after </think> is content, not reasoning.
    out = V32_THINK.parse("The tool says sunny.</think>It is sunny in Paris." + EOS)
    assert (out.content, out.reasoning_content) == ("It is sunny in Paris.", "The tool says sunny.")


def test_bug08_bare_invoke_unterminated_block_malformed_sibling_sglang_40236():
    bare = f"{I('get_weather')}\n{P('location', 'true')}Paris{PE}\n{P('days', 'false')}3{PE}\n{IE}{EOS}"
    unterminated = f"{FC}\n{I('get_weather')}\n{P('location', 'true')}Paris{PE}\n{P('days', 'false')}3{PE}\n"
    sibling = (
        f"{FC}\n<{D}invoke nam='x'>\n{P('a', 'true')}1{PE}\n{IE}\n"  # no name: skipped
        f"{I('get_weather')}\n{P('location', 'true')}Paris{PE}\n{P('days', 'false')}3{PE}\n{IE}\n{FCE}"
    )
    for text in (bare, unterminated, sibling):
        out = V32.parse(text)
        assert (out.content, calls_of(out), out.finish_reason) == (None, WEATHER, "tool_calls")
        assert_same_everywhere(V32, text)


def test_bug09_parameter_without_prefix_or_string_attr_sglang_39435():
    text = (
        f'{FC}\n{I("get_weather")}\n<parameter name="location">Paris</parameter>\n'
        f'<{D}parameter name="days">3</{D}parameter>\n{IE}\n{FCE}'
    )
    out = V32.parse(text)
    assert calls_of(out) == WEATHER  # not a silent {}
    assert_same_everywhere(V32, text)


def test_bug10_partial_value_never_changes_shape_on_the_wire_sglang_39632():
    """string="false" values go out whole at their close tag: a prefix that looks like JSON is never sent."""
    for value, expected in (
        ('{"a": [1, 2', '{"a": [1, 2'),
        ('{"a": [1, 2]}', {"a": [1, 2]}),
        ("[1, 2] x", "[1, 2] x"),
    ):
        text = f"{FC}\n{I('f')}\n{P('v', 'false')}{value}{PE}\n{IE}\n{FCE}"
        per_feed, deltas, out = stream(V32, chunked(text, 1))
        assert calls_of(out) == [("f", {"v": expected})]
        fragments = _arg_fragments(deltas)
        assert fragments[0] == '{"v": '  # the key goes out at once, the value only whole
        assert fragments[1] == json.dumps(expected, ensure_ascii=False)


def test_bug11_arguments_stream_incrementally_sglang_19662():
    value = "word " * 200
    text = f"{FC}\n{I('write')}\n{P('text', 'true')}{value}{PE}\n{IE}\n{FCE}"
    per_feed, deltas, out = stream(V32, chunked(text, 10))
    assert len(_arg_fragments(deltas)) > 90
    assert calls_of(out) == [("write", {"text": value})]


def test_bug12_no_marker_fragment_leaks_as_content_vllm_40801():
    text = "Sure, checking now." + "\n\n" + dsml_block(WEATHER) + EOS
    for size in (1, 2, 3, 4, 5, 7):
        _, deltas, out = stream(V32, chunked(text, size))
        shown = [d.content for d in deltas if d.content]
        assert "".join(shown) == "Sure, checking now."
        assert not any("<" in s or "\uff5c" in s for s in shown)


def test_bug13_long_string_argument_not_held_until_close_vllm_52846():
    chunks = [f"{FC}\n{I('emit')}\n{P('text', 'true')}", *(["B" * 50] * 40), f"{PE}\n{IE}\n{FCE}"]
    per_feed, deltas, out = stream(V32, chunks)
    streamed_before_close = "".join(
        tc.arguments or "" for feed in per_feed[1:-2] for d in feed for tc in d.tool_calls
    )
    assert streamed_before_close == "B" * 50 * 40  # every piece went out as it arrived
    assert calls_of(out) == [("emit", {"text": "B" * 2000})]


def test_bug14_special_tokens_must_be_kept_by_the_detokenizer_vllm_33964():
    """The parser needs the DSML delimiters in the text; unrelated special tokens are left to the user."""
    kept = "Hi" + "\n\n" + dsml_block(WEATHER)
    assert calls_of(V32.parse(kept)) == WEATHER
    stripped = kept.replace("\uff5cDSML\uff5c", "")  # what skip_special_tokens would leave: plain tags
    assert calls_of(V32.parse(stripped)) == WEATHER  # still understood (plain-tag tolerance)
    other = "A <\uff5cplace\u2581holder\u2581no\u25811\uff5c> B"
    assert V32.parse(other).content == other


def test_bug18_no_schema_coercion_vllm():
    text = (
        f"{FC}\n{I('f')}\n{P('n', 'true')}42{PE}\n{P('s', 'true')}null{PE}\n{P('x', 'false')}3.0{PE}\n"
        f'{P("arguments", "false")}{{"inner": 1}}{PE}\n{IE}\n{FCE}'
    )
    args = json.loads(V32.parse(text).tool_calls[0].arguments)
    assert args == {"n": "42", "s": "null", "x": 3.0, "arguments": {"inner": 1}}  # no unwrapping either
    assert isinstance(args["x"], float)


def test_bug19_reasoning_content_field_name_vllm_27752():
    out = V32_THINK.parse("why</think>answer")
    assert "reasoning_content" in out.to_dict() and "reasoning" not in out.to_dict()
    assert set(ParsedOutput(None, None, [], "stop").to_dict()) == {
        "content",
        "reasoning_content",
        "tool_calls",
        "finish_reason",
    }
    _, deltas, _ = stream(V32_THINK, ["why</think>answer"])
    assert [set(d.to_dict()) for d in deltas] == [{"reasoning_content"}, {"content"}]


def test_bug20_several_calls_and_think_end_in_one_delta_sglang():
    two = WEATHER + [("get_time", {})]
    per_feed, deltas, out = stream(V32_THINK, ["plan</think>\n\n" + dsml_block(two) + EOS])
    assert (out.reasoning_content, out.content, calls_of(out)) == ("plan", None, two)
    assert len(per_feed[0]) == 5  # reasoning, head 0, args 0, head 1, args 1: all from the single feed
    v31 = OutputParser("deepseekv31")
    per_feed, deltas, out = stream(v31, [v31_block(two)])
    assert calls_of(out) == two and len(per_feed[0]) == 4


def test_bug21_repeated_calls_begin_token_sglang_5224():
    text = f'{CALLS_BEGIN}{CALLS_BEGIN}{CALL_BEGIN}f{SEP}{{"a": "全角｜字符"}}{CALL_END}{CALLS_END}{EOS}'
    parser = OutputParser("deepseekv31")
    out = parser.parse(text)
    assert (out.content, calls_of(out)) == (None, [("f", {"a": "全角｜字符"})])
    assert_same_everywhere(parser, text)


def test_bug22_multiple_blocks_prose_between_and_lt_in_prose_sglang():
    text = (
        f"Is 5 < 6? Yes.\n\n{dsml_block(WEATHER)}\nThen a<b too.\n\n{dsml_block([('get_time', {})])}\n5 < 6"
    )
    out = V32.parse(text)
    assert out.content == "Is 5 < 6? Yes.\n\nThen a<b too.\n\n5 < 6"
    assert [c.name for c in out.tool_calls] == ["get_weather", "get_time"]
    per_feed, deltas, _ = stream(V32, chunked(text, 1))
    # "5 < 6" streams out as soon as the character after "<" shows it is not a marker.
    first = "".join(d.content or "" for feed in per_feed[: len("Is 5 < 6")] for d in feed)
    assert first == "Is 5 < 6"
    assert_same_everywhere(V32, text)


def test_bug23_zero_parameter_invoke_is_empty_object_sglang_vllm():
    text = f"{FC}\n{I('get_time')}\n\n{IE}\n{FCE}"
    per_feed, deltas, out = stream(V32, chunked(text, 1))
    assert [c.arguments for c in out.tool_calls] == ["{}"]
    assert _arg_fragments(deltas) == ["{}"]
