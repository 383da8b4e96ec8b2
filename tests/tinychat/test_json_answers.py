"""The JSON-answer conversations (``train.tinychat.json_answers``): every reply is a short document that
validates against its schema and that the server's grammar accepts token by token; held-out keys stay out of
training; the held-out set covers what it should and is deterministic; ``json_share`` mixes them in."""

from __future__ import annotations

import json
import random
import re
from collections import Counter

import pytest

from train.tinychat import json_answers as J
from train.tinychat.dataset import conversations, render

jsonschema = pytest.importorskip("jsonschema")


@pytest.fixture(scope="module")
def train_json():
    rng = random.Random(3)
    return [J.sample_json(rng, heldout=False, invent=0.35) for _ in range(600)]


def _values(doc):
    if isinstance(doc, dict):
        for v in doc.values():
            yield from _values(v)
    elif isinstance(doc, list):
        yield doc
        for v in doc:
            yield from _values(v)
    else:
        yield doc


def test_every_reply_is_a_short_document_of_its_schema(train_json):
    kinds, styles = Counter(), Counter()
    for conv in train_json:
        schema, doc = conv.expect["schema"], conv.expect["answer"]
        jsonschema.validate(doc, schema)
        reply = conv.messages[-1]["content"]
        assert reply == json.dumps(doc)  # compact, ", " and ": ": the form the grammar allows
        assert list(doc) == list(schema["properties"])  # the schema's property order
        for v in _values(doc):
            if isinstance(v, float):
                assert re.fullmatch(r"-?\d{1,4}\.\d{1,2}", repr(v)), v
            elif isinstance(v, int) and not isinstance(v, bool):
                assert abs(v) < 100_000, v
            elif isinstance(v, str):
                assert 0 < len(v.split()) <= 8, v
            elif isinstance(v, list):
                assert 1 <= len(v) <= 4, v
        kinds[conv.expect["question"]] += 1
        styles[conv.expect["style"]] += 1
    assert set(kinds) == set(J.QUESTIONS) and set(styles) == {"system", "schema", "keys", "plain"}
    assert {c.mode for c in train_json} == {"chat", "thinking"}


def test_the_grammar_accepts_every_reply_token_by_token(train_json):
    """The training text is what constrained decoding can write: the engine's grammar (compact JSON,
    properties in order) accepts each reply's tokens, then the end of sequence."""
    pytest.importorskip("xgrammar")
    from dsa_runtime.engine.structured import GrammarBackend, StructuredOutput
    from dsa_runtime.loader import embedded_model_path
    from dsa_runtime.loader.tokenizer import load_tokenizer

    tok = load_tokenizer(embedded_model_path())
    eos = tok.token_to_id("<｜end▁of▁sentence｜>")
    backend = GrammarBackend(tok, len(tok), [eos])
    for conv in train_json[:150]:
        state = backend.state(StructuredOutput.json_schema(conv.expect["schema"]))
        ids = tok.encode(conv.messages[-1]["content"], add_special_tokens=False)
        assert all(state.accept(t) is None for t in ids), conv.messages[-1]["content"]
        assert state.accept(eos) == "stop"


def test_held_out_keys_never_appear_in_training():
    held = {k for pools in J.KEYS.values() for k in pools[1]}
    held |= {k for pools in (*J.FACT_KEYS.values(), *J.EXTRACT_KEYS.values(), J.RESULT_KEYS, J.LIST_KEYS)
             for k in pools[1]}
    train = {k for pools in J.KEYS.values() for k in pools[0]}
    assert not held & train
    texts = [render(c).text for c in conversations(800, heldout=False, seed=4, invent=0.35, json_share=0.5)]
    for key in held:
        assert not any(f'"{key}"' in t for t in texts), key
    for thing in J.THINGS[1]:
        assert not any(f" {thing}" in t for t in texts), thing


def test_held_out_set_is_deterministic_and_covers_every_shape():
    a, b = J.heldout_set(), J.heldout_set()
    assert [render(c).text for c in a] == [render(c).text for c in b] and len(a) == 48
    held = {k for pools in J.KEYS.values() for k in pools[1]}
    held |= {k for pools in (*J.FACT_KEYS.values(), *J.EXTRACT_KEYS.values(), J.RESULT_KEYS, J.LIST_KEYS)
             for k in pools[1]}
    feats, styles = Counter(), Counter()
    for conv in a:
        jsonschema.validate(conv.expect["answer"], conv.expect["schema"])
        assert set(conv.expect["schema"]["properties"]) <= held
        feats.update(J.schema_features(conv.expect["schema"]))
        styles[conv.expect["style"]] += 1
    assert {"number", "string", "array", "nested", "enum", "boolean"} <= set(feats)
    assert feats["number"] >= 10 and feats["string"] >= 10, feats
    assert set(styles) == {"system", "schema", "keys", "plain"}
    assert sum(c.mode == "thinking" for c in a) == 12


def test_json_share_mixes_json_answers_into_the_mixture():
    convs = list(conversations(1000, heldout=False, seed=9, json_share=0.3))
    share = sum(c.kind == "json" for c in convs) / len(convs)
    assert 0.25 < share < 0.35
    assert {c.kind for c in convs} - {"json"} == {"greeting", "fact", "arith", "convert", "tool", "notool"}
    plain = [render(c).text for c in conversations(50, heldout=False, seed=9)]
    assert plain == [render(c).text for c in conversations(50, heldout=False, seed=9, json_share=0.0)]
