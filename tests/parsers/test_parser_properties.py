"""Property tests: generated completions in every format and any chunking; fuzzing; encoder round trip.

Budget: the profile below keeps this module to about ten seconds on 2 cores. ``DSA_PARSER_EXAMPLES=2000`` (env)
runs a deeper search locally.
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    D,
    I,
    P,
    Verbatim,
    arguments_of,
    check_deltas,
    chunked,
    dsml_block,
    split_at,
    stream,
    summary,
    v3_block,
    v31_block,
)

settings.register_profile(
    "dsa-parsers",
    max_examples=int(os.environ.get("DSA_PARSER_EXAMPLES", "200")),
    deadline=None,  # timings on a shared 2-core CI box are noise, not a property
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
PROFILE = settings(settings.get_profile("dsa-parsers"))
FUZZ = settings(PROFILE, max_examples=PROFILE.max_examples * 2)

# -- strategies ------------------------------------------------------------------------------------------
_ALPHABET = list("abcXYZ019 \n\t.,;:!?'\"=/<>&{}[]()-_#*`\\") + [
    "杭",
    "州",
    "🌤",
    "️",
    "é",
    "Ж",
    "｜",
    "▁",
    "\u3000",
]
_CHARS = st.sampled_from(_ALPHABET) | st.characters(blacklist_categories=("Cs",))
_PROSE_BAN = ("<function_call", "<tool_calls", "<\uff5c", "</\uff5c", "<think>", "</think>")
_VALUE_BAN = ("</parameter", "<\uff5c", "</\uff5c")


def _free_of(banned):
    return lambda s: not any(b in s for b in banned)


prose = st.text(_CHARS, max_size=30).filter(_free_of(_PROSE_BAN))
value_text = st.text(_CHARS, max_size=30).filter(_free_of(_VALUE_BAN))
keys = st.text(st.sampled_from(list("abcxyz_-. 名值é")), min_size=1, max_size=8)
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | value_text
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(value_text, inner, max_size=3),
    max_leaves=8,
)
arguments = st.dictionaries(keys, value_text | json_values, max_size=4)
calls = st.lists(st.tuples(names, arguments), max_size=4)

RENDER = {"dsml": dsml_block, "v31": v31_block, "v3": v3_block}
PARSERS_FOR = {
    "dsml": ["deepseekv32", "deepseekv32", "deepseekv31"],
    "v31": ["deepseekv31", "deepseekv3", "deepseekv32"],
    "v3": ["deepseekv3", "deepseekv31", "deepseekv32"],
}


@st.composite
def completions(draw, fmt: str = "dsml"):
    """(text, OutputParser kwargs, expected summary) for a well-formed completion."""
    think = draw(st.booleans())
    reasoning, content, post = draw(prose), draw(prose), draw(prose)
    the_calls = draw(calls)
    text = reasoning + "</think>" if think else ""
    if the_calls:
        text += content + ("\n\n" if fmt == "dsml" else "") + RENDER[fmt](the_calls) + "\n" + post
        visible = "\n\n".join(p for p in (content.rstrip(), post.strip()) if p)
    else:
        text += content
        visible = content
    text += draw(st.sampled_from(["", EOS]))
    # Each parser also reads the other family's unambiguous form, so any of them must recover the calls.
    kwargs = {"tool_parser": draw(st.sampled_from(PARSERS_FOR[fmt]))}
    if think:
        kwargs.update(draw(st.sampled_from([{"thinking": True}, {"reasoning_parser": "deepseek-r1"}])))
    expected = (
        visible or None,
        (reasoning or None) if think else None,
        [(name, list(args.items()), "function") for name, args in the_calls],
        "tool_calls" if the_calls else "stop",
    )
    return text, kwargs, expected


def _check_everywhere(text, parser, expected, cuts):
    whole = parser.parse(text)
    assert summary(whole) == expected
    for chunks in (split_at(text, cuts), chunked(text, 1)):
        _, deltas, out = stream(parser, chunks)
        check_deltas(deltas)
        assert summary(out) == expected
        assert [c.arguments for c in out.tool_calls] == [c.arguments for c in whole.tool_calls]


@pytest.mark.parametrize("fmt", ["dsml", "v31", "v3"])
@PROFILE
@given(data=st.data())
def test_generated_completions_any_chunking(fmt, data):
    """Streamed == whole == what was rendered; no delta carries markup; every call recovered."""
    text, kwargs, expected = data.draw(completions(fmt))
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    _check_everywhere(text, OutputParser(**kwargs), expected, cuts)


@PROFILE
@given(data=st.data(), the_calls=st.lists(st.tuples(names, arguments), min_size=1, max_size=3))
def test_reasoning_interrupted_by_block(data, the_calls):
    """A block opened before </think> ends the reasoning (upstream bug 1), for any chunking."""
    reasoning = data.draw(prose)
    text = reasoning + "\n\n" + dsml_block(the_calls) + EOS
    expected = (
        None,
        reasoning.rstrip() or None,
        [(n, list(a.items()), "function") for n, a in the_calls],
        "tool_calls",
    )
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    _check_everywhere(text, OutputParser("deepseekv32", "deepseek-v3", thinking=True), expected, cuts)


# -- fuzzing ---------------------------------------------------------------------------------------------
FRAGMENTS = [
    FC,
    FCE,
    I("f"),
    I(""),
    IE,
    P("k", "true"),
    P("k", "false"),
    P("k", "maybe"),
    PE,
    f'<{D}invoke name="h"/>',
    f"<{D}tool_calls>",
    f"<{D}parameter>",
    "<function_calls>",
    "</function_calls>",
    '<invoke name="g">',
    "</invoke>",
    '<parameter name="p" string="true">',
    '<parameter name="q">',
    "</parameter>",
    "<think>",
    "</think>",
    EOS,
    CALLS_BEGIN,
    CALLS_END,
    CALL_BEGIN,
    CALL_END,
    SEP,
    "function",
    "get_x\n",
    "```json\n",
    "```",
    "{",
    "}",
    '{"a": 1}',
    "[1, 2",
    '"',
    "<",
    "</",
    "<\uff5c",
    "<\uff5cDS",
    "\uff5cDSML\uff5c",
    "/>",
    ">",
    "\n",
    "\n\n",
    " ",
    "text",
    "Привет",
    "🌤",
    "5 < 6",
    'name="x"',
    "null",
    "-2.5",
    "NaN",
    "1e999",
    "[" * 40,
]
fuzz_text = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=4), max_size=40).map("".join)
CONFIGS = [
    {"tool_parser": "deepseekv32"},
    {"tool_parser": "deepseekv32", "thinking": True},
    {"tool_parser": "deepseekv31", "reasoning_parser": "deepseek-r1"},
    {"tool_parser": "deepseekv3"},
    {"tool_parser": None, "reasoning_parser": "deepseek-r1"},
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(str(v) for v in c.values()))
@FUZZ
@given(data=st.data(), text=fuzz_text | st.text(max_size=60), truncated=st.booleans())
def test_fuzz_never_raises_and_chunking_never_matters(config, data, text, truncated):
    parser = OutputParser(**config)
    whole = parser.parse(text, truncated=truncated)
    expected = summary(whole)  # arguments: a JSON object, or the model's malformed text kept verbatim
    counted = parser.stream()
    counted.feed(text)
    counted.finish(truncated)
    assert counted.parse_errors == sum(isinstance(arguments_of(c.arguments), Verbatim) for c in whole.tool_calls)
    assert whole.finish_reason == ("tool_calls" if whole.tool_calls else "length" if truncated else "stop")
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=10))
    for chunks in (split_at(text, cuts), chunked(text, 1)):
        _, deltas, out = stream(parser, chunks, truncated)
        check_deltas(deltas, markup=())
        assert summary(out) == expected


# -- round trip through the V3.2 encoder -----------------------------------------------------------------
encoding_v32 = pytest.importorskip("dsa_runtime.parsers.encoding_v32")


@PROFILE
@given(
    thinking=st.booleans(),
    reasoning=prose,
    content=prose,
    the_calls=st.lists(st.tuples(names, arguments), max_size=3),
    cut=st.integers(1, 7),
)
def test_encode_then_parse_round_trip(thinking, reasoning, content, the_calls, cut):
    """The official layout, rendered by the colleague's encoder, parses back into the message."""
    if thinking and not reasoning and not the_calls:
        reasoning = "r"  # the encoder rejects a thinking-mode answer with neither reasoning nor calls
    message = {
        "role": "assistant",
        "content": content,
        "reasoning_content": reasoning if thinking else None,
        "tool_calls": [
            {"type": "function", "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False)}}
            for n, a in the_calls
        ],
    }
    completion = encoding_v32.encode_messages(
        [message],
        thinking_mode="thinking" if thinking else "chat",
        context=[{"role": "user", "content": "q"}],
    )
    parser = OutputParser("deepseekv32", "deepseek-v3", thinking=thinking)
    expected = (
        (content.rstrip() if the_calls else content) or None,
        (reasoning or None) if thinking else None,
        [(n, list(a.items()), "function") for n, a in the_calls],
        "tool_calls" if the_calls else "stop",
    )
    assert summary(parser.parse(completion)) == expected
    _, deltas, out = stream(parser, chunked(completion, cut))
    check_deltas(deltas)
    assert summary(out) == expected
