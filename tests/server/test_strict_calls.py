"""Strict tool calls in every DeepSeek call format: the embedded model (which never saw the V3.1 / V3 formats)
sampled at temperature 1.0 under the constraint that ``tool_call_constraint`` builds, after the forced
opening; our own parser of that format reads every completion as calls with schema-valid arguments."""

from __future__ import annotations

import json

import pytest

from dsa_runtime.engine import Engine, EngineConfig, SamplingParams
from dsa_runtime.parsers import OutputParser
from dsa_runtime.parsers.tool_choice import resolve_tool_choice
from dsa_runtime.testing.json_schemas import random_object_schemas
from tests.engine.helpers import run_all

pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")
from dsa_runtime.server.structured import tool_call_constraint  # noqa: E402


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(EngineConfig(max_running_requests=32))


def _complete(engine: Engine, choices: list, call_format: str, seeds: range, parallel: bool = True) -> list:
    """One sampled completion per (choice, seed) pair, all in one batch; ``choices`` one per seed, or one for all."""
    if len(choices) == 1:
        choices = choices * len(seeds)
    for choice, seed in zip(choices, seeds, strict=True):
        spec = tool_call_constraint(choice, call_format, parallel)
        assert spec is not None and spec.kind == "structural_tag"
        prompt = engine.tokenizer.encode("<｜User｜>Call the tool.<｜Assistant｜></think>" + choice.forced)
        engine.add_request(f"c{seed}", prompt, SamplingParams(temperature=1.0, max_tokens=500, seed=seed,
                                                              structured=spec, skip_special_tokens=False))
    outs = run_all(engine)
    return [outs[f"c{seed}"][-1] for seed in seeds]


@pytest.mark.parametrize("call_format", ["deepseekv32", "deepseekv31", "deepseekv3"])
def test_named_and_required_calls_parse_with_valid_arguments(engine, call_format):
    schemas = random_object_schemas(10, seed=31)
    tools = [{"type": "function", "function": {"name": f"fn_{i}", "parameters": s}} for i, s in enumerate(schemas)]
    by_name = {f"fn_{i}": s for i, s in enumerate(schemas)}
    # named: the chosen tool's arguments (eight requests, each naming another tool, in one batch)
    choices = [resolve_tool_choice(tools, {"type": "function", "function": {"name": f"fn_{i}"}}, call_format)
               for i in range(8)]
    for i, (choice, out) in enumerate(zip(choices, _complete(engine, choices, call_format, range(8)), strict=True)):
        assert out.finish_reason == "stop", (call_format, out.text)
        parsed = OutputParser(call_format).parse(choice.forced + out.text)
        assert [c.name for c in parsed.tool_calls] == [f"fn_{i}"], (call_format, out.text)
        try:
            jsonschema.validate(json.loads(parsed.tool_calls[0].arguments), schemas[i])
        except jsonschema.ValidationError as exc:
            raise AssertionError((call_format, out.text, parsed.tool_calls[0].arguments)) from exc
    # required, one call (parallel_tool_calls false: the sampled model would otherwise go on calling)
    choice = resolve_tool_choice(tools[:3], "required", call_format)
    for out in _complete(engine, [choice], call_format, range(4), parallel=False):
        assert out.finish_reason == "stop", (call_format, out.text)
        parsed = OutputParser(call_format).parse(choice.forced + out.text)
        assert len(parsed.tool_calls) == 1 and parsed.finish_reason == "tool_calls", (call_format, out.text)
        for call in parsed.tool_calls:
            jsonschema.validate(json.loads(call.arguments), by_name[call.name])


def test_no_constraint_without_a_forced_call_or_a_strict_tool():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert tool_call_constraint(resolve_tool_choice(tools, "auto", "deepseekv32"), "deepseekv32") is None
    assert tool_call_constraint(resolve_tool_choice(tools, "none", "deepseekv32"), "deepseekv32") is None
    strict = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": True}}]
    auto = tool_call_constraint(resolve_tool_choice(strict, "auto", "deepseekv31"), "deepseekv31")
    assert auto is not None and '"triggered_tags"' in auto.spec
