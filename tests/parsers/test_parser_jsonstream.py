"""The incremental JSON-object streamer behind V3/V3.1 arguments."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsa_runtime.parsers import OutputParser
from dsa_runtime.parsers.jsonstream import JsonObjectStream
from dsa_runtime.parsers.values import object_json
from tests.parsers.parser_kit import (
    CALL_BEGIN,
    CALL_END,
    CALLS_BEGIN,
    CALLS_END,
    SEP,
    calls_of,
    split_at,
    stream,
)
from tests.parsers.test_parser_properties import FUZZ, PROFILE

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)
layouts = st.sampled_from(
    [
        {},
        {"separators": (",", ":")},
        {"indent": 2},
        {"ensure_ascii": False},
        {"indent": "\t", "ensure_ascii": False},
    ]
)


def _run(text: str, cuts=()) -> str:
    s = JsonObjectStream()
    return "".join(s.feed(piece) for piece in split_at(text, cuts)) + s.close()


@PROFILE
@given(value=st.dictionaries(st.text(max_size=6), json_values, max_size=5), layout=layouts, data=st.data())
def test_valid_objects_come_through_equal_for_any_chunking(value, layout, data):
    text = json.dumps(value, **layout)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=8))
    out = _run(text, cuts)
    assert json.loads(out) == value
    assert out == _run(text)  # same bytes for any chunking


@PROFILE
@given(value=st.dictionaries(st.text(max_size=6), json_values, min_size=1, max_size=4), layout=layouts)
def test_every_prefix_is_kept_verbatim_and_sent_text_only_grows(value, layout):
    """Nothing sent is ever taken back, and a call cut after any prefix keeps exactly the model's text."""
    text = json.dumps(value, **layout)
    s = JsonObjectStream()
    sent = ""
    for i, ch in enumerate(text):
        sent += s.feed(ch)
        probe = JsonObjectStream()
        closed = probe.feed(text[: i + 1]) + probe.close()
        assert closed.startswith(sent)
        # Unfinished: the model's text (less trailing whitespace between tokens), never repaired into an object.
        assert text[: i + 1].startswith(closed) and not text[len(closed) : i + 1].strip()


@FUZZ
@given(text=st.text(st.sampled_from(list('{}[]",:\\ u0a1-.etrufalsn\n\x01x`')) | st.characters(), max_size=40))
def test_fuzz_chunking_never_matters_and_objects_survive(text):
    out = _run(text)
    assert out == _run(text, range(0, len(text), 3)) == _run(text, range(len(text)))
    try:
        value = json.loads(text)
    except ValueError:
        return
    if isinstance(value, dict) and "\x01" not in text:
        assert json.loads(out) == value  # valid objects come through (as written)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("", {}),
        ("  \n", {}),
        ("```json\n", {}),  # a fence with nothing in it is no argument text (a V3 call cut after its fence)
        ("```json\n\n```", {}),
        ('```json\n{"a": 1}\n```', {"a": 1}),
        ('{"a": 1,}', {"a": 1}),
        ('{"a": [1,],}', {"a": [1]}),
        ('{"a": "line\nbreak\ttab"}', {"a": "line\nbreak\ttab"}),
        ('{"a": "\\u00e9\\n\\"q\\"", "b": "\\ud83d\\ude00"}', {"a": 'é\n"q"', "b": "😀"}),
        ('{"a": 1} trailing {"b": 2}', {"a": 1}),
        ('{"a": {"b": [true, false, null]}}', {"a": {"b": [True, False, None]}}),
    ],
)
def test_repair_rules(raw, expected):
    assert json.loads(object_json(raw)) == expected
    assert json.loads(_run(raw, range(len(raw)))) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("no object here", "no object here"),
        ('["a"]', '["a"]'),
        ("{bad json", "{bad json"),
        ('{"a": 1, "b": oops}', '{"a": 1, "b": oops}'),
        ('{"a": "unterminated', '{"a": "unterminated'),
        ('{"a": [1, 2, {"b": tru', '{"a": [1, 2, {"b": tru'),
        ('{"a": "bad \\x escape"}', '{"a": "bad \\x escape"}'),
        ('{"a": -0.5e+3, "b": 12', '{"a": -0.5e+3, "b": 12'),
        ('{"a": 01}', '{"a": 01}'),
        ('{"k" "v"}', '{"k" "v"}'),
        ('{\u3000"a": 1}', '{\u3000"a": 1}'),  # not JSON whitespace: malformed, not skipped
        ('{"a": 1, \n', '{"a": 1,'),  # trailing whitespace of malformed text dropped
        ("```json\n{'a': 1}\n```  \n", "{'a': 1}"),  # and the fences around it
        ("```\nnot json\n```", "not json"),
    ],
)
def test_malformed_arguments_kept_verbatim(raw, expected):
    """Malformed arguments are the model's own text (a client's json.loads fails visibly), never {}."""
    assert object_json(raw) == expected
    assert _run(raw, range(len(raw))) == expected
    assert _run(raw, range(0, len(raw), 4)) == expected


def test_v31_arguments_stream_before_the_call_ends():
    value = "x" * 3000
    text = f'{CALLS_BEGIN}{CALL_BEGIN}write{SEP}{{"text": "{value}", "n": 1}}{CALL_END}{CALLS_END}'
    per_feed, deltas, out = stream(
        OutputParser("deepseekv31"), [text[i : i + 50] for i in range(0, len(text), 50)]
    )
    fragments = [tc.arguments for d in deltas for tc in d.tool_calls if tc.id is None]
    assert len(fragments) > 50  # streamed piece by piece, not whole at the end
    assert calls_of(out) == [("write", {"text": value, "n": 1})]


def test_v31_object_closed_but_end_token_cut_off_still_a_call():
    """The call is complete when its object closes: truncation after that keeps it."""
    text = f'{CALLS_BEGIN}{CALL_BEGIN}f{SEP}{{"a": 1}}<\uff5ctool\u2581call\u2581e'
    out = OutputParser("deepseekv31").parse(text, truncated=True)
    assert (calls_of(out), out.finish_reason) == ([("f", {"a": 1})], "tool_calls")
