"""A larger vector set on the canonical rules of docs/parsers.md: deviations, truncation, malformed values,
V3.1/V3 variants.

Every vector is checked whole and streamed under many chunkings (same result, valid delta shapes).
"""

from __future__ import annotations

import json
import time

import pytest

from dsa_runtime.parsers import OutputParser
from dsa_runtime.parsers.stream import collect
from tests.parsers.parser_kit import (
    CALL_BEGIN,
    CALL_END,
    CALLS_BEGIN,
    CALLS_END,
    EOS,
    FC,
    FCE,
    IE,
    MARKUP,
    PE,
    SEP,
    D,
    I,
    P,
    Verbatim,
    assert_same_everywhere,
    calls_of,
    dsml_block,
)

V32 = {"tool_parser": "deepseekv32"}
THINK = {"tool_parser": "deepseekv32", "reasoning_parser": "deepseek-v3", "thinking": True}
V31 = {"tool_parser": "deepseekv31"}
V3 = {"tool_parser": "deepseekv3"}
R1 = {"tool_parser": None, "reasoning_parser": "deepseek-r1"}
GET_TIME = f"{FC}\n{I('get_time')}\n\n{IE}\n{FCE}"


def block1(name: str, **args) -> str:
    return dsml_block([(name, args)])


# id: (kwargs, text, truncated, content, reasoning, [(name, args)], finish_reason)
CASES = {
    # -- several blocks, prose around them --
    "two-blocks-prose-between-and-after": (
        V32,
        f"A\n\n{block1('f', x='1')}\nB\n\n{block1('g', y='2')}\nC",
        False, "A\n\nB\n\nC", None, [("f", {"x": "1"}), ("g", {"y": "2"})], "tool_calls",
    ),
    "prose-after-is-stripped": (
        V32, f"{GET_TIME}\n\n  Done. \u3000\n", False, "Done.", None, [("get_time", {})], "tool_calls",
    ),
    "whitespace-only-before-block": (V32, f" \n\t\n\n{GET_TIME}", False, None, None, [("get_time", {})], "tool_calls"),
    "leading-whitespace-kept": (V32, f"\n  Hi\n\n{GET_TIME}", False, "\n  Hi", None, [("get_time", {})], "tool_calls"),
    "no-block-text-verbatim": (V32, "  Hello  \n", False, "  Hello  \n", None, [], "stop"),
    "empty": (V32, "", False, None, None, [], "stop"),
    "empty-truncated": (V32, "", True, None, None, [], "length"),
    "eos-only": (V32, EOS, False, None, None, [], "stop"),
    "eos-in-the-middle-dropped": (V32, f"Hello{EOS} world", False, "Hello world", None, [], "stop"),
    # -- "<" in prose and values --
    "lt-in-prose": (V32, "5 < 6 and a<b, <br/> x</y> <", False, "5 < 6 and a<b, <br/> x</y> <", None, [], "stop"),
    "lt-in-prose-before-block": (
        V32, f"if a <b> c <\n\n{GET_TIME}", False, "if a <b> c <", None, [("get_time", {})], "tool_calls",
    ),
    "plain-invoke-in-prose-is-prose": (
        V32, 'Use <invoke name="x"> and <parameter>.', False, 'Use <invoke name="x"> and <parameter>.', None, [],
        "stop",
    ),
    "lt-and-tags-in-string-value": (
        V32,
        f'{FC}\n{I("html")}\n{P("s", "true")}<div a="1"> 5 < 6 </div> <parameter x> </invoke>{PE}\n{IE}\n{FCE}',
        False, None, None, [("html", {"s": '<div a="1"> 5 < 6 </div> <parameter x> </invoke>'})], "tool_calls",
    ),
    "string-value-verbatim-whitespace": (
        V32, f'{FC}\n{I("f")}\n{P("s", "true")}\n  a\n\tb "q" \\ \n{PE}\n{IE}\n{FCE}',
        False, None, None, [("f", {"s": '\n  a\n\tb "q" \\ \n'})], "tool_calls",
    ),
    # -- unicode, nesting, scalars --
    "unicode-names-keys-values": (
        V32, f'{FC}\n{I("天气")}\n{P("城市", "true")}Москва 🌧️{PE}\n{P("n", "false")}["ж", {{"k": "é"}}]{PE}\n{IE}\n{FCE}',
        False, None, None, [("天气", {"城市": "Москва 🌧️", "n": ["ж", {"k": "é"}]})], "tool_calls",
    ),
    "deeply-nested-json": (
        V32, block1("f", a={"b": [{"c": [1, {"d": None}]}], "e": {"f": {"g": [True, False, 0.5]}}}),
        False, None, None, [("f", {"a": {"b": [{"c": [1, {"d": None}]}], "e": {"f": {"g": [True, False, 0.5]}}}})],
        "tool_calls",
    ),
    "json-string-value-in-false": (
        V32, f'{FC}\n{I("f")}\n{P("s", "false")}"quoted"{PE}\n{P("n", "false")}  42 \n{PE}\n{IE}\n{FCE}',
        False, None, None, [("f", {"s": "quoted", "n": 42})], "tool_calls",
    ),
    # -- zero-argument calls --
    "zero-args-no-newlines": (V32, f"{FC}{I('a')}{IE}{FCE}", False, None, None, [("a", {})], "tool_calls"),
    "zero-args-self-closing": (
        V32, f'{FC}\n<{D}invoke name="a"/>\n<{D}invoke name="b" />\n{FCE}', False, None, None,
        [("a", {}), ("b", {})], "tool_calls",
    ),
    # -- truncation --
    "truncated-mid-value": (
        V32, f"Let me check.\n\n{FC}\n{I('get_weather')}\n{P('location', 'true')}Hang",
        True, "Let me check.", None, [], "length",
    ),
    "truncated-after-first-call": (
        V32, f"{FC}\n{I('a')}\n\n{IE}\n{I('b')}\n{P('x', 'false')}[1, 2", True, None, None, [("a", {})], "tool_calls",
    ),
    "truncated-before-block-close": (
        V32, f"{FC}\n{I('a')}\n{P('x', 'true')}1{PE}\n{IE}\n", True, None, None, [("a", {"x": "1"})], "tool_calls",
    ),
    "truncated-before-invoke-close": (
        V32, f"Hi\n\n{FC}\n{I('a')}\n{P('x', 'true')}1{PE}\n", True, "Hi", None, [], "length",
    ),
    "truncated-in-start-marker": (V32, "Let me check.\n\n<\uff5cDSML\uff5cfunc", True, "Let me check.", None, [], "length"),
    "truncated-in-invoke-tag": (V32, f'Hi\n\n{FC}\n<{D}invoke name="ge', True, "Hi", None, [], "length"),
    "truncated-reasoning": (THINK, "Hmm, let me", True, None, "Hmm, let me", [], "length"),
    "truncated-reasoning-in-block": (
        THINK, f"I need data.\n\n{FC}\n{I('a')}\n{P('x', 'true')}v", True, None, "I need data.", [], "length",
    ),
    # -- unterminated at a normal stop: the call is kept, closed --
    "unterminated-block-stop": (
        V32, f"{FC}\n{I('x')}\n{P('a', 'true')}v", False, None, None, [("x", {"a": "v"})], "tool_calls",
    ),
    "unterminated-false-value-stop": (
        V32, f"{FC}\n{I('x')}\n{P('a', 'false')}[1, 2]", False, None, None, [("x", {"a": [1, 2]})], "tool_calls",
    ),
    "cut-close-tag-at-stop": (
        V32, f"{FC}\n{I('x')}\n{P('a', 'false')}7</\uff5cDSML\uff5cpara", False, None, None, [("x", {"a": 7})],
        "tool_calls",
    ),
    # -- malformed string="false" values fall back to the stripped raw string --
    "malformed-false-values": (
        V32,
        f'{FC}\n{I("f")}\n{P("a", "false")} {{"a": 1, {PE}\n{P("b", "false")}Привет мир{PE}\n'
        f'{P("c", "false")}NaN{PE}\n{P("d", "false")}1e999{PE}\n{P("e", "false")}{PE}\n{P("f", "false")}tru{PE}\n'
        f"{IE}\n{FCE}",
        False, None, None,
        [("f", {"a": '{"a": 1,', "b": "Привет мир", "c": "NaN", "d": "1e999", "e": "", "f": "tru"})], "tool_calls",
    ),
    # -- tags without the DSML prefix, or mixed --
    "plain-tags": (
        V32,
        'Sure.\n\n<function_calls>\n<invoke name="f">\n<parameter name="a" string="true">x</parameter>\n'
        '<parameter name="n" string="false">3</parameter>\n</invoke>\n</function_calls>',
        False, "Sure.", None, [("f", {"a": "x", "n": 3})], "tool_calls",
    ),
    "mixed-tags": (
        V32,
        f'{FC}\n<invoke name="f">\n{P("a", "true")}x</parameter>\n<parameter name="b" string="true">y{PE}\n'
        f"</invoke>\n</function_calls>",
        False, None, None, [("f", {"a": "x", "b": "y"})], "tool_calls",
    ),
    "plain-block-tag-in-prose-stays-prose": (
        V32, "Wrap calls in <function_calls>\n  tags, then <tool_calls>.", False,
        "Wrap calls in <function_calls>\n  tags, then <tool_calls>.", None, [], "stop",
    ),
    "plain-empty-block": (V32, "A\n<function_calls>\n</function_calls>\nB", False, "A\n\nB", None, [], "stop"),
    "v4-tool-calls-block-name": (
        V32, f"<{D}tool_calls>\n{I('f')}\n\n{IE}\n</{D}tool_calls>", False, None, None, [("f", {})], "tool_calls",
    ),
    "bare-invoke-without-block": (
        V32, f"Hi\n\n{I('f')}\n{P('a', 'true')}1{PE}\n{IE}\nBye", False, "Hi\n\nBye", None, [("f", {"a": "1"})],
        "tool_calls",
    ),
    "tag-spacing-quotes-case": (
        V32,
        f"{FC}\n<{D}invoke  name=' f ' >\n<{D}parameter string=\"True\" name=\"a\">x</{D}parameter >\n{IE}\n{FCE}",
        False, None, None, [("f", {"a": "x"})], "tool_calls",
    ),
    # -- body deviations --
    "raw-json-invoke-body": (
        V32, f'{FC}\n{I("f")}\n{{"a": 1, "b": ["x"]}}\n{IE}\n{FCE}', False, None, None, [("f", {"a": 1, "b": ["x"]})],
        "tool_calls",
    ),
    # Malformed raw arguments are kept verbatim, never turned into {} (docs/parsers.md).
    "raw-json-body-invalid": (
        V32, f"{FC}\n{I('f')}\n{{oops\n{IE}\n{FCE}", False, None, None, [("f", Verbatim("{oops"))], "tool_calls",
    ),
    "raw-json-body-array": (
        V32, f'{FC}\n{I("f")}\n["a"]\n{IE}\n{FCE}', False, None, None, [("f", Verbatim('["a"]'))], "tool_calls",
    ),
    "duplicate-parameter-first-wins": (
        V32, f"{FC}\n{I('f')}\n{P('a', 'true')}1{PE}\n{P('a', 'true')}2{PE}\n{IE}\n{FCE}", False, None, None,
        [("f", {"a": "1"})], "tool_calls",
    ),
    "parameter-without-string-attr": (
        V32, f'{FC}\n{I("f")}\n<{D}parameter name="n">5</{D}parameter>\n<{D}parameter name="s">hi</{D}parameter>\n'
        f"{IE}\n{FCE}",
        False, None, None, [("f", {"n": 5, "s": "hi"})], "tool_calls",
    ),
    "missing-param-and-invoke-close": (
        V32, f"{FC}\n{I('f')}\n{P('a', 'true')}1\n{I('g')}\n{P('b', 'false')}2\n{FCE}", False, None, None,
        [("f", {"a": "1\n"}), ("g", {"b": 2})], "tool_calls",
    ),
    "nameless-invoke-skipped": (
        V32, f'{FC}\n<{D}invoke>\n{P("a", "true")}1{PE}\n{IE}\n{I("g")}\n\n{IE}\n{FCE}', False, None, None,
        [("g", {})], "tool_calls",
    ),
    "prose-inside-block-is-content": (
        V32, f"{FC}\nI'll call it.\n{I('f')}\n\n{IE}\n{FCE}", False, "I'll call it.", None, [("f", {})], "tool_calls",
    ),
    # -- reasoning --
    "think-tag-with-leading-space-stripped": (R1, "\n<think>Hmm</think>Hi", False, "Hi", "Hmm", [], "stop"),
    "stray-think-tags-dropped-from-content": (THINK, "r</think>a</think>b<think>c", False, "abc", "r", [], "stop"),
    "reasoning-whitespace-verbatim": (THINK, "  r \n</think> a ", False, " a ", "  r \n", [], "stop"),
    "block-ends-reasoning": (
        THINK, f"Need time.\n\n{GET_TIME}\nIt is noon.", False, "It is noon.", "Need time.", [("get_time", {})],
        "tool_calls",
    ),
    # -- V3.1 / V3 variants --
    "v31-content-before-and-after": (
        V31, f'Let me see. {CALLS_BEGIN}{CALL_BEGIN}f{SEP}{{"a": 1}}{CALL_END}{CALLS_END}\nDone.{EOS}',
        False, "Let me see.\n\nDone.", None, [("f", {"a": 1})], "tool_calls",
    ),
    "v31-no-calls-begin-no-call-end": (
        V31, f'{CALL_BEGIN}f{SEP}{{"a": 1}}{CALL_BEGIN}g{SEP}{{}}{CALLS_END}', False, None, None,
        [("f", {"a": 1}), ("g", {})], "tool_calls",
    ),
    "v31-invalid-args": (V31, f"{CALLS_BEGIN}{CALL_BEGIN}f{SEP}{{nope{CALL_END}{CALLS_END}", False, None, None,
                         [("f", Verbatim("{nope"))], "tool_calls"),
    "v31-array-args": (V31, f'{CALLS_BEGIN}{CALL_BEGIN}f{SEP}["a"]{CALL_END}{CALLS_END}', False, None, None,
                       [("f", Verbatim('["a"]'))], "tool_calls"),
    "v31-unclosed-object-at-stop": (V31, f'{CALLS_BEGIN}{CALL_BEGIN}f{SEP}{{"a": [1, {CALL_END}', False, None, None,
                                    [("f", Verbatim('{"a": [1,'))], "tool_calls"),
    "v3-fenced-malformed": (
        V3, f"{CALLS_BEGIN}{CALL_BEGIN}function{SEP}f\n```json\n{{'a': 1}}\n```{CALL_END}{CALLS_END}", False, None,
        None, [("f", Verbatim("{'a': 1}"))], "tool_calls",
    ),
    "v31-args-with-trailing-junk": (
        V31, f'{CALLS_BEGIN}{CALL_BEGIN}f{SEP}{{"a": "<｜x"}} trailing{CALL_END}{CALLS_END}', False, None, None,
        [("f", {"a": "<｜x"})], "tool_calls",
    ),
    "v31-truncated": (V31, f'{CALLS_BEGIN}{CALL_BEGIN}f{SEP}{{"a": 1', True, None, None, [], "length"),
    "v31-name-function": (
        V31, f'{CALLS_BEGIN}{CALL_BEGIN}function{SEP}{{"a": 1}}{CALL_END}{CALLS_END}', False, None, None,
        [("function", {"a": 1})], "tool_calls",
    ),
    "v3-without-fence": (
        V3, f'{CALLS_BEGIN}{CALL_BEGIN}function{SEP}f\n{{"a": 1}}{CALL_END}{CALLS_END}', False, None, None,
        [("f", {"a": 1})], "tool_calls",
    ),
    "v3-zero-args-name-only": (
        V3, f"{CALLS_BEGIN}{CALL_BEGIN}function{SEP}get_time{CALL_END}{CALLS_END}", False, None, None,
        [("get_time", {})], "tool_calls",
    ),
    "v3-with-reasoning": (
        {"tool_parser": "deepseekv3", "reasoning_parser": "deepseek-r1"},
        f'<think>plan</think>\n\n{CALLS_BEGIN}{CALL_BEGIN}function{SEP}f\n```json\n{{"a": [1]}}\n```{CALL_END}{CALLS_END}',
        False, None, "plan", [("f", {"a": [1]})], "tool_calls",
    ),
    "v31-stray-tokens-in-prose-dropped": (V31, f"a{CALL_END}b{SEP}c", False, "abc", None, [], "stop"),
    # -- no tool parser --
    "tool-parser-none-keeps-markup": (
        {"tool_parser": None}, f"x\n\n{GET_TIME}", False, f"x\n\n{GET_TIME}", None, [], "stop",
    ),
}

# Vectors whose visible text legitimately contains characters of MARKUP.
PROSE_MARKUP = {
    "tool-parser-none-keeps-markup": (),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_extended_vector(case):
    kwargs, text, truncated, content, reasoning, calls, finish_reason = CASES[case]
    parser = OutputParser(**kwargs)
    out = parser.parse(text, truncated=truncated)
    assert (out.content, out.reasoning_content, calls_of(out), out.finish_reason) == (
        content,
        reasoning,
        calls,
        finish_reason,
    )
    for call, (_, args) in zip(out.tool_calls, calls, strict=True):
        if not isinstance(args, Verbatim):
            assert list(json.loads(call.arguments)) == list(args)
    assert_same_everywhere(parser, text, truncated=truncated, markup=PROSE_MARKUP.get(case, MARKUP))


@pytest.mark.parametrize(
    "text",
    ["<\uff5cDSX hello", "a <\uff5cDS b", "<\uff5cDSML\uff5cfoo> x", "<\uff5cUser\uff5c> kept", "x <\uff5c"],
)
def test_not_a_marker_is_eventually_content(text):
    """A ``<｜DS`` that turns into something else is shown; only a cut-off marker at the very end is not."""
    parser = OutputParser(**V32)
    expected = text.removesuffix("<\uff5c").rstrip() if text.endswith("<\uff5c") else text
    assert parser.parse(text).content == expected
    assert_same_everywhere(parser, text, markup=())


def test_junk_then_brace_in_invoke_is_not_a_raw_body_for_any_cut():
    """Regression (found by the fuzzer): skipping stray text must not depend on where a chunk ends."""
    parser = OutputParser("deepseekv31", "deepseek-r1")
    text = f'<{D}invoke name="f"><think>{{<{D}parameter name="k" string="true">v{PE}{IE}'
    expected = parser.parse(text)
    assert calls_of(expected) == [("f", {"k": "v"})]
    for cut in range(1, len(text)):
        stream = parser.stream()
        deltas = stream.feed(text[:cut]) + stream.feed(text[cut:])
        tail, reason = stream.finish()
        assert calls_of(collect(deltas + tail, reason)) == [("f", {"k": "v"})], cut


@pytest.mark.parametrize("kwargs", [V32, THINK])
def test_whitespace_flood_streams_in_linear_time(kwargs):
    """A model stuck emitting whitespace token by token must not make the held whitespace quadratic."""
    stream = OutputParser(**kwargs).stream()
    start = time.perf_counter()
    stream.feed("x")
    for _ in range(200_000):
        stream.feed(" ")
    stream.feed("y")
    stream.finish()
    assert time.perf_counter() - start < 5.0  # quadratic: ~7 s here; linear: ~0.3 s
