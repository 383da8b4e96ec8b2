"""Structured output through the embedded model: outputs sampled at temperature 1.0 under a grammar (assorted
JSON schemas, any JSON object, a regex, an EBNF grammar) all parse and validate; an invalid schema is a
ValueError at admission; a budget too short ends with ``length``; the constraint can start after a token
(``</think>``); an unconstrained request batched with constrained ones samples as it would alone."""

from __future__ import annotations

import json
import re

import pytest

from dsa_runtime.engine import Engine, EngineConfig, SamplingParams
from dsa_runtime.engine.structured import GrammarState, StructuredOutput
from dsa_runtime.testing.json_schemas import random_object_schemas
from tests.engine.helpers import run_all

pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(EngineConfig(max_running_requests=64))


def _prompt(engine: Engine, text: str) -> list[int]:
    return engine.tokenizer.encode(f"<｜User｜>{text}<｜Assistant｜></think>")


def test_fifty_schemas_at_temperature_one_all_validate(engine):
    schemas = random_object_schemas(50, seed=21)
    for i, schema in enumerate(schemas):
        engine.add_request(f"s{i}", _prompt(engine, "Reply with the data as JSON."),
                           SamplingParams(temperature=1.0, max_tokens=400, seed=i,
                                          structured=StructuredOutput.json_schema(schema)))
    outs = run_all(engine)
    for i, schema in enumerate(schemas):
        last = outs[f"s{i}"][-1]
        assert last.finish_reason == "stop", (schema, last.text)
        jsonschema.validate(json.loads(last.text), schema)  # raises on a mismatch
        assert "".join(o.new_text for o in outs[f"s{i}"]) == last.text  # streamed pieces make the whole


@pytest.mark.parametrize(("spec", "check"), [
    (StructuredOutput("regex", r"(yes|no), [0-9]{2,4}!"), lambda t: re.fullmatch(r"(yes|no), [0-9]{2,4}!", t)),
    (StructuredOutput("ebnf", 'root ::= "[" item ("," item)? ("," item)? "]"\nitem ::= [a-c] [a-c]? [a-c]?'),
     lambda t: re.fullmatch(r"\[[a-c]{1,3}(,[a-c]{1,3}){0,2}\]", t)),
])
def test_other_grammars(engine, spec, check):
    for seed in range(4):
        engine.add_request(f"g{seed}", _prompt(engine, "Answer."),
                           SamplingParams(temperature=1.0, max_tokens=300, seed=seed, structured=spec))
    outs = run_all(engine)
    for seed in range(4):
        last = outs[f"g{seed}"][-1]
        assert last.finish_reason == "stop" and check(last.text), (last.finish_reason, last.text)


def test_any_json_object_is_valid_when_it_stops(engine):
    """Keys and strings are unbounded here, so a sampled object may run out of tokens: then it ends with
    ``length``; whenever it ends with ``stop`` the text is a JSON object."""
    for seed in range(6):
        engine.add_request(f"o{seed}", _prompt(engine, "Answer."),
                           SamplingParams(temperature=1.0, max_tokens=60, seed=seed,
                                          structured=StructuredOutput("json_object")))
    outs = run_all(engine)
    for seed in range(6):
        last = outs[f"o{seed}"][-1]
        assert last.text.startswith("{")
        if last.finish_reason == "stop":
            assert isinstance(json.loads(last.text), dict)
        else:
            assert last.finish_reason == "length"


def test_invalid_schema_is_refused_at_admission(engine):
    bad = StructuredOutput("json_schema", '{"type": "nonsense"}')
    with pytest.raises(ValueError, match="invalid JSON schema"):
        engine.add_request("bad", _prompt(engine, "x"), SamplingParams(structured=bad))
    assert not engine.has_unfinished()


def test_a_budget_too_short_ends_with_length_not_stop(engine):
    schema = {"type": "object", "properties": {"story": {"type": "string", "minLength": 50}}, "required": ["story"]}
    engine.add_request("short", _prompt(engine, "Tell a story as JSON."),
                       SamplingParams(temperature=1.0, max_tokens=8, seed=1,
                                      structured=StructuredOutput.json_schema(schema)))
    last = run_all(engine)["short"][-1]
    assert last.finish_reason == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(last.text)


def test_the_constraint_starts_after_its_token(engine):
    prompt = _prompt(engine, "What is 2 + 2?")
    engine.add_request("free", prompt, SamplingParams(temperature=0, max_tokens=3))
    free = run_all(engine)["free"][-1].token_ids
    # The greedy run's second token as the start marker: the first two tokens stay free, the rest matches.
    spec = StructuredOutput("regex", r"\{(yes|no)\}", after_token_id=free[1])
    engine.add_request("after", prompt, SamplingParams(temperature=0, max_tokens=200, structured=spec))
    last = run_all(engine)["after"][-1]
    assert last.token_ids[:2] == free[:2] and last.finish_reason == "stop"
    tail = engine.tokenizer.decode(last.token_ids[2:], skip_special_tokens=True)
    assert tail in ("{yes}", "{no}")


def test_grammar_state_waits_for_its_token():
    class Matcher:
        accepted: list[int] = []

        def accept_token(self, t):
            self.accepted.append(t)
            return t != 99

        def is_terminated(self):
            return self.accepted[-1] == 7

    state = GrammarState(Matcher(), after_token_id=5)
    assert [state.accept(t) for t in (1, 5)] == [None, None] and state.active and Matcher.accepted == []
    assert [state.accept(t) for t in (3, 7)] == [None, "stop"]
    assert GrammarState(Matcher(), None).accept(99) == "rejected"


def test_unconstrained_neighbours_sample_as_alone():
    # float32 on the CPU: its greedy picks do not depend on the batch (GPU kernels round by batch shape).
    engine = Engine(EngineConfig(dtype="float32", device="cpu", max_running_requests=8))
    prompt = _prompt(engine, "Hello!")
    engine.add_request("alone", prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    alone = run_all(engine)["alone"][-1].token_ids
    engine.add_request("json", prompt, SamplingParams(temperature=1.0, max_tokens=40, seed=3,
                                                      structured=StructuredOutput("json_object")))
    engine.add_request("free", prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    outs = run_all(engine)
    assert outs["free"][-1].token_ids == alone
    assert engine.stats().pages_used == 0
