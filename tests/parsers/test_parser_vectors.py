"""Example vectors of the canonical rules in docs/parsers.md (T1-T11, S1-S4, V31a, V3a, R1a-c), whole and streamed."""

from __future__ import annotations

import json

import pytest

from dsa_runtime.parsers import OutputParser
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
    I,
    P,
    assert_same_everywhere,
    calls_of,
    check_deltas,
    chunked,
    stream,
)

CHAT = {"tool_parser": "deepseekv32"}
THINK = {"tool_parser": "deepseekv32", "reasoning_parser": "deepseek-v3", "thinking": True}

T2_TEXT = (
    f"\n\n{FC}\n{I('get_weather')}\n{P('location', 'true')}Hangzhou{PE}\n{IE}\n"
    f"{I('get_weather')}\n{P('location', 'true')}Beijing{PE}\n{IE}\n{FCE}{EOS}"
)

# id: (parser kwargs, text, content, reasoning, [(name, args)], finish_reason)
VECTORS = {
    "T1": (
        CHAT,
        f"Let me check.\n\n{FC}\n{I('get_weather')}\n{P('location', 'true')}Hangzhou{PE}\n"
        f"{P('date', 'true')}2024-01-16{PE}\n{IE}\n{FCE}{EOS}",
        "Let me check.",
        None,
        [("get_weather", {"location": "Hangzhou", "date": "2024-01-16"})],
        "tool_calls",
    ),
    "T2": (
        CHAT,
        T2_TEXT,
        None,
        None,
        [("get_weather", {"location": "Hangzhou"}), ("get_weather", {"location": "Beijing"})],
        "tool_calls",
    ),
    "T3": (
        THINK,
        f"需要日期📅</think>\n\n{FC}\n{I('get_datetime')}\n{P('timezone', 'true')}Asia/Shanghai{PE}\n{IE}\n{FCE}{EOS}",
        None,
        "需要日期📅",
        [("get_datetime", {"timezone": "Asia/Shanghai"})],
        "tool_calls",
    ),
    "T4": (
        THINK,
        f"Reasoning here.</think>Final answer.{EOS}",
        "Final answer.",
        "Reasoning here.",
        [],
        "stop",
    ),
    "T5": (
        CHAT,
        f"{FC}\n{I('search')}\n{P('topn', 'false')}10{PE}\n{P('verbose', 'false')}true{PE}\n"
        f"{P('cursor', 'false')}null{PE}\n{P('ratio', 'false')}-2.5{PE}\n{IE}\n{FCE}",
        None,
        None,
        [("search", {"topn": 10, "verbose": True, "cursor": None, "ratio": -2.5})],
        "tool_calls",
    ),
    "T6": (
        CHAT,
        f'{FC}\n{I("query")}\n{P("filters", "false")}{{"tags": ["a", "b"], "range": {{"min": 1, "max": 5}}}}{PE}\n'
        f"{P('ids', 'false')}[1, 2, 3]{PE}\n{IE}\n{FCE}",
        None,
        None,
        [("query", {"filters": {"tags": ["a", "b"], "range": {"min": 1, "max": 5}}, "ids": [1, 2, 3]})],
        "tool_calls",
    ),
    "T7": (
        CHAT,
        f"{FC}\n{I('geo')}\n{P('zip', 'true')}02139{PE}\n{IE}\n{FCE}",
        None,
        None,
        [("geo", {"zip": "02139"})],
        "tool_calls",
    ),
    "T9": (
        CHAT,
        f"{FC}\n{I('w')}\n{P('city', 'true')}杭州🌤️{PE}\n{IE}\n{FCE}",
        None,
        None,
        [("w", {"city": "杭州🌤️"})],
        "tool_calls",
    ),
    "T10": (CHAT, f"{FC}\n{I('get_time')}\n\n{IE}\n{FCE}{EOS}", None, None, [("get_time", {})], "tool_calls"),
    "T11": (
        CHAT,
        f"Checking.\n\n{FC}\n{I('get_time')}\n\n{IE}\n{FCE}\nDone.",
        "Checking.\n\nDone.",
        None,
        [("get_time", {})],
        "tool_calls",
    ),
    "V31a": (
        {"tool_parser": "deepseekv31"},
        f'{CALLS_BEGIN}{CALL_BEGIN}get_current_weather{SEP}{{"location": "Tokyo"}}{CALL_END}'
        f'{CALL_BEGIN}get_current_weather{SEP}{{"location": "Paris"}}{CALL_END}{CALLS_END}{EOS}',
        None,
        None,
        [("get_current_weather", {"location": "Tokyo"}), ("get_current_weather", {"location": "Paris"})],
        "tool_calls",
    ),
    "V3a": (
        {"tool_parser": "deepseekv3"},
        f'{CALLS_BEGIN}{CALL_BEGIN}function{SEP}get_current_weather\n```json\n{{"location": "Tokyo"}}\n```'
        f"{CALL_END}\n{CALL_BEGIN}function{SEP}get_current_weather\n```json\n"
        f'{{"location": "Paris"}}\n```{CALL_END}{CALLS_END}{EOS}',
        None,
        None,
        [("get_current_weather", {"location": "Tokyo"}), ("get_current_weather", {"location": "Paris"})],
        "tool_calls",
    ),
    "R1a": (
        {"tool_parser": None, "reasoning_parser": "deepseek-r1"},
        "Okay, 2+2.</think>\n\nThe answer is 4.",
        "\n\nThe answer is 4.",
        "Okay, 2+2.",
        [],
        "stop",
    ),
    "R1b": (
        {"tool_parser": None, "reasoning_parser": "deepseek-r1"},
        "<think>Hmm</think>Hi",
        "Hi",
        "Hmm",
        [],
        "stop",
    ),
    "R1c": (
        {"tool_parser": None, "reasoning_parser": "deepseek-r1"},
        "Hmm, let me",
        None,
        "Hmm, let me",
        [],
        "stop",
    ),
}


def _check(out, content, reasoning, calls, finish_reason):
    assert out.content == content
    assert out.reasoning_content == reasoning
    assert calls_of(out) == calls
    for call, (_, args) in zip(out.tool_calls, calls, strict=True):
        assert list(json.loads(call.arguments)) == list(args)  # key order = appearance order
        assert call.type == "function"
    assert out.finish_reason == finish_reason


@pytest.mark.parametrize("vid", sorted(VECTORS))
def test_vector_whole_text(vid):
    kwargs, text, *expected = VECTORS[vid]
    _check(OutputParser(**kwargs).parse(text), *expected)


@pytest.mark.parametrize("vid", sorted(VECTORS))
def test_vector_streamed_any_chunking(vid):
    kwargs, text, *expected = VECTORS[vid]
    parser = OutputParser(**kwargs)
    assert_same_everywhere(parser, text, seeds=6)
    _, deltas, out = stream(parser, chunked(text, 1))
    _check(out, *expected)


@pytest.mark.parametrize("vid", ["R1a", "R1b", "R1c"])
@pytest.mark.parametrize(
    "kwargs",
    [
        {"reasoning_parser": "deepseek-r1"},  # with the default DSML tool parser
        {"tool_parser": None, "reasoning_parser": "deepseek-v3", "thinking": True},
        {"tool_parser": None, "thinking": True},  # thinking alone picks deepseek-v3
    ],
)
def test_reasoning_vectors_same_with_v3_thinking(vid, kwargs):
    _, text, *expected = VECTORS[vid]
    _check(OutputParser(**kwargs).parse(text), *expected)


@pytest.mark.parametrize("vid", ["R1a", "R1b", "R1c", "T4"])
def test_v3_reasoning_without_thinking_is_identity(vid):
    text = VECTORS[vid][1]
    out = OutputParser(tool_parser=None, reasoning_parser="deepseek-v3", thinking=False).parse(text)
    assert out.reasoning_content is None
    assert out.content == text.replace(EOS, "")


def test_t9_arguments_keep_characters_unescaped():
    out = OutputParser(**CHAT).parse(VECTORS["T9"][1])
    assert "杭州🌤️" in out.tool_calls[0].arguments


def test_t10_zero_args_text_is_braces():
    assert OutputParser(**CHAT).parse(VECTORS["T10"][1]).tool_calls[0].arguments == "{}"


def test_s1_marker_split_across_chunks():
    chunks = [
        "Hi",
        "!\n\n<\uff5cDS",
        "ML\uff5cfunction_calls>\n<\uff5cDSML\uff5cinv",
        'oke name="get_time">\n\n</\uff5cDSML\uff5cinvoke>\n</\uff5cDSML\uff5cfunction_calls>',
    ]
    per_feed, deltas, out = stream(OutputParser(**CHAT), chunks)
    check_deltas(deltas)
    assert out.content == "Hi!"
    assert calls_of(out) == [("get_time", {})]
    for d in deltas:
        assert "<\uff5cDS" not in (d.content or "")
    assert [d.content for d in per_feed[0]] == ["Hi"]
    assert [d.content for d in per_feed[1]] == ["!"]  # "\n\n<｜DS" held back


def test_s2_one_character_chunks():
    per_feed, deltas, out = stream(OutputParser(**CHAT), chunked(T2_TEXT, 1))
    check_deltas(deltas)
    assert (out.content, calls_of(out)) == (None, VECTORS["T2"][4])
    heads = [tc for d in deltas for tc in d.tool_calls if tc.id is not None]
    assert [(h.index, h.name) for h in heads] == [(0, "get_weather"), (1, "get_weather")]
    assert len({h.id for h in heads}) == 2


def test_s3_long_string_argument_streams_before_its_close_tag():
    chunks = [f"{FC}\n{I('emit')}\n{P('text', 'true')}", *(["A" * 32] * 128), f"{PE}\n{IE}\n{FCE}"]
    per_feed, deltas, out = stream(OutputParser(**CHAT), chunks)
    check_deltas(deltas)
    before_close = [tc for feed in per_feed[:-2] for d in feed for tc in d.tool_calls if tc.id is None]
    assert len(before_close) >= 2
    assert "A" * 64 in "".join(tc.arguments or "" for tc in before_close)
    assert calls_of(out) == [("emit", {"text": "A" * 4096})]


def test_s4_think_end_split_across_chunks():
    chunks = ["Let me", " think", "</th", "ink>", "Answer", EOS]
    per_feed, deltas, out = stream(OutputParser(**THINK), chunks)
    check_deltas(deltas)
    assert [d.reasoning_content for d in deltas if d.reasoning_content] == ["Let me", " think"]
    assert (out.reasoning_content, out.content, out.finish_reason) == ("Let me think", "Answer", "stop")
    assert all("</th" not in (d.content or "") + (d.reasoning_content or "") for d in deltas)
