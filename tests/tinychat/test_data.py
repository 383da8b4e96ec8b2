"""The tiny-chat data generator (``train.tinychat``): V3.2 encoding, loss spans, tool calls that parse
back, held-out split, and the tokenizer it trains."""

from __future__ import annotations

import json

import pytest

from dsa_runtime.parsers import OutputParser
from train.tinychat import world
from train.tinychat.dataset import conversations, render
from train.tinychat.dialogs import MIXTURE, heldout_pair, sample
from train.tinychat.tools import HELDOUT_PAIRS, TOOLS


@pytest.fixture(scope="module")
def train_convs():
    return list(conversations(400, heldout=False, seed=11))


def test_every_kind_is_generated_and_tools_have_valid_schemas(train_convs):
    assert {c.kind for c in train_convs} == set(MIXTURE)
    assert len(TOOLS) >= 30 and len({t.name for t in TOOLS}) == len(TOOLS)
    for t in TOOLS:
        params = t.schema()["function"]["parameters"]
        assert set(t.required) <= set(params["properties"]), t.name


def test_assistant_spans_are_exactly_what_the_model_writes(train_convs):
    for conv in train_convs[:80]:
        r = render(conv)
        assert r.text.startswith("<｜begin▁of▁sentence｜>")
        assert len(r.spans) == sum(m["role"] == "assistant" for m in conv.messages)
        for a, b in r.spans:
            assert r.text[b - len("<｜end▁of▁sentence｜>"):b] == "<｜end▁of▁sentence｜>"
            assert r.text[a - len("<think>"):a] in ("<think>", "/think>")


def test_tool_call_turns_parse_back_into_the_expected_calls(train_convs):
    tools = [c for c in train_convs if c.kind == "tool"]
    assert len(tools) > 100
    for conv in tools:
        r = render(conv)
        a, b = r.spans[0]
        parsed = OutputParser("deepseekv32", "deepseek-v3", thinking=conv.mode == "thinking").parse(r.text[a:b])
        got = [{"name": c.name, "arguments": json.loads(c.arguments)} for c in parsed.tool_calls]
        assert got == conv.expect["calls"]
        assert parsed.finish_reason == "tool_calls"
    kinds = {type(v).__name__ for c in tools for call in c.expect["calls"] for v in call["arguments"].values()}
    assert {"str", "int", "bool", "list", "dict"} <= kinds


def test_training_never_holds_a_held_out_entity_or_pair(train_convs):
    held = set(world.HELDOUT_CITIES) | set(world.HELDOUT_NAMES) | set(world.HELDOUT_TICKERS)
    for conv in train_convs:
        text = render(conv).text
        assert not any(h in text for h in held), conv.messages[0]
        if conv.tools:
            offered = {t["function"]["name"] for t in conv.tools}
            assert not any(pair <= offered for pair in HELDOUT_PAIRS)
        if conv.kind == "arith":
            q = conv.messages[0]["content"]
            nums = [int(x) for x in __import__("re").findall(r"\d+", q)]
            assert not heldout_pair(*nums[:2])


def test_held_out_split_uses_held_out_entities_and_is_deterministic():
    a = [render(c).text for c in conversations(60, heldout=True)]
    b = [render(c).text for c in conversations(60, heldout=True)]
    assert a == b
    assert any(city in t for t in a for city in world.HELDOUT_CITIES)


@pytest.mark.parametrize("kind", ["arith", "convert"])
def test_reasoning_traces_end_in_the_answer(kind):
    import random

    rng = random.Random(5)
    for _ in range(50):
        conv = sample(rng, heldout=False, kind=kind, mode="thinking")
        reply = conv.messages[-1]
        assert reply["reasoning_content"].rstrip(".").endswith(conv.expect["answer"])
        assert conv.expect["answer"] in reply["content"]


def test_invented_values_fill_argument_slots_and_never_hold_held_out_entities():
    convs = [c for c in conversations(300, heldout=False, seed=5, invent=0.5) if c.kind == "tool"]
    known = {v.lower() for group in (world.CITIES, world.FIRST_NAMES, world.TICKERS, world.TOPICS, world.ITEMS,
                                     world.PHRASES) for v in group}
    invented = set()
    for conv in convs:
        for call in conv.expect["calls"]:
            for key in ("city", "origin", "destination", "name", "ticker", "query", "topic", "text"):
                value = call["arguments"].get(key)
                if isinstance(value, str) and value.lower() not in known:
                    invented.add(value)
                    # the argument is copied from the request, never recalled from a list
                    assert value in conv.messages[0]["content"], (value, conv.messages[0])
    assert len(invented) > 30
    held = {h.lower() for group in (world.HELDOUT_CITIES, world.HELDOUT_NAMES, world.HELDOUT_TICKERS)
            for h in group}
    texts = [render(c).text.lower() for c in convs]
    assert not any(h in t for t in texts for h in held)
    again = [render(c).text.lower() for c in conversations(300, heldout=False, seed=5, invent=0.5)
             if c.kind == "tool"]
    assert texts == again


def test_the_chat_tokenizer_is_the_embedded_models_byte_for_byte():
    """``make-checkpoint --preset tiny-chat`` copies the embedded tokenizer instead of running this generator."""
    from dsa_runtime.loader import embedded_model_path
    from train.tinychat.tokenizer import train_chat_tokenizer

    shipped = (embedded_model_path() / "tokenizer.json").read_text(encoding="utf-8")
    assert train_chat_tokenizer(3072).to_str(pretty=True) + "\n" == shipped
