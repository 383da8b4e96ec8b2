"""Registration, name resolution, the lazy public API, result types and the low-level parser APIs."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

import dsa_runtime.parsers as parsers_pkg
from dsa_runtime.errors import ConfigError
from dsa_runtime.parser_spec import ParserSpec
from dsa_runtime.parsers import OutputParser, get_reasoning_parser, get_tool_parser
from dsa_runtime.parsers import plugin as parser_plugin
from dsa_runtime.parsers.reasoning import DeepSeekR1ReasoningParser, DeepSeekV3ReasoningParser
from dsa_runtime.parsers.scanner import ARGS, BLOCK, CALL, END, TEXT, Event
from dsa_runtime.parsers.tool_parsers import (
    DeepSeekV3ToolParser,
    DeepSeekV31ToolParser,
    DeepSeekV32ToolParser,
)
from dsa_runtime.parsers.types import Delta, ParsedOutput, ToolCall, ToolCallDelta, new_call_id
from tests.parsers.parser_kit import CALL_ID, FC, FCE, IE, PE, I, P

EXPECTED_SPECS = {
    ("encoder", "deepseekv32"): ("dsa_runtime.parsers.encoding_v32:encode_messages", ("deepseek_v32",)),
    ("encoder", "jinja"): ("dsa_runtime.parsers.jinja_template:render_chat_template", ()),
    ("tool", "deepseekv32"): ("dsa_runtime.parsers.tool_parsers:DeepSeekV32ToolParser", ("deepseek_v32",)),
    ("tool", "deepseekv31"): ("dsa_runtime.parsers.tool_parsers:DeepSeekV31ToolParser", ("deepseek_v31",)),
    ("tool", "deepseekv3"): ("dsa_runtime.parsers.tool_parsers:DeepSeekV3ToolParser", ("deepseek_v3",)),
    ("reasoning", "deepseek-r1"): (
        "dsa_runtime.parsers.reasoning:DeepSeekR1ReasoningParser",
        ("deepseek_r1",),
    ),
    ("reasoning", "deepseek-v3"): (
        "dsa_runtime.parsers.reasoning:DeepSeekV3ReasoningParser",
        ("deepseek_v3",),
    ),
}


def _registered() -> list[ParserSpec]:
    got: list[ParserSpec] = []
    parser_plugin.dsa_register_parsers(got.append)
    return got


def test_hook_registers_every_parser_with_lazy_factories():
    specs = _registered()
    assert {(s.kind, s.name): (s.factory, s.aliases) for s in specs} == EXPECTED_SPECS
    assert all(isinstance(s, ParserSpec) and s.description for s in specs)


@pytest.mark.parametrize("key", sorted(EXPECTED_SPECS))
def test_every_factory_imports(key):
    spec = next(s for s in _registered() if (s.kind, s.name) == key)
    assert callable(parser_plugin.load_factory(spec))


def test_hook_is_a_pluggy_hookimpl_and_the_entry_point_exists():
    assert hasattr(parser_plugin.dsa_register_parsers, "dsa_runtime_impl")
    eps = {ep.name: ep.value for ep in entry_points(group="dsa_runtime.parsers")}
    assert eps.get("deepseek") == "dsa_runtime.parsers.plugin"


def test_project_plugin_manager_sees_the_same_table():
    from dsa_runtime.plugin_manager import get_manager

    manager = get_manager()
    for (kind, name), (factory, aliases) in EXPECTED_SPECS.items():
        for alias in (name, *aliases):
            spec = manager.get_parser(kind, alias)
            assert (spec.name, spec.factory, spec.plugin) == (name, factory, "deepseek")


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("deepseekv32", DeepSeekV32ToolParser),
        ("deepseek_v32", DeepSeekV32ToolParser),
        ("deepseekv31", DeepSeekV31ToolParser),
        ("deepseek_v31", DeepSeekV31ToolParser),
        ("deepseekv3", DeepSeekV3ToolParser),
        ("deepseek_v3", DeepSeekV3ToolParser),
    ],
)
def test_get_tool_parser_names_and_aliases(name, cls):
    assert get_tool_parser(name) is cls


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("deepseek-r1", DeepSeekR1ReasoningParser),
        ("deepseek_r1", DeepSeekR1ReasoningParser),
        ("deepseek-v3", DeepSeekV3ReasoningParser),
        ("deepseek_v3", DeepSeekV3ReasoningParser),
    ],
)
def test_get_reasoning_parser_names_and_aliases(name, cls):
    assert get_reasoning_parser(name) is cls


def test_unknown_names_raise_config_error_listing_valid_ones():
    with pytest.raises(ConfigError) as exc:
        get_tool_parser("deepseekv4")
    assert all(n in str(exc.value) for n in ("deepseekv32", "deepseekv31", "deepseekv3", "deepseek_v32"))
    with pytest.raises(ConfigError) as exc:
        get_reasoning_parser("qwen3")
    assert "deepseek-r1" in str(exc.value) and "deepseek-v3" in str(exc.value)
    with pytest.raises(ConfigError):
        OutputParser(tool_parser="nope")
    with pytest.raises(ConfigError):
        OutputParser(reasoning_parser="nope")


def test_public_api_is_lazy():
    code = (
        "import sys, dsa_runtime.parsers as p; "
        "assert 'dsa_runtime.parsers.output' not in sys.modules; "
        "p.OutputParser; assert 'dsa_runtime.parsers.output' in sys.modules; print('ok')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "ok", proc.stderr


def test_public_api_names():
    for name in (
        "OutputParser",
        "ParsedOutput",
        "ToolCall",
        "Delta",
        "get_tool_parser",
        "get_reasoning_parser",
    ):
        assert name in dir(parsers_pkg) and getattr(parsers_pkg, name) is not None
    assert callable(parsers_pkg.encode_messages)
    with pytest.raises(AttributeError):
        parsers_pkg.no_such_thing  # noqa: B018


def test_types_to_dict_shapes():
    call = ToolCall(id="call_" + "0" * 24, name="f", arguments="{}")
    assert call.to_dict() == {"id": call.id, "type": "function", "function": {"name": "f", "arguments": "{}"}}
    out = ParsedOutput(content=None, reasoning_content="r", tool_calls=[call], finish_reason="tool_calls")
    assert out.to_dict() == {
        "content": None,
        "reasoning_content": "r",
        "tool_calls": [call.to_dict()],
        "finish_reason": "tool_calls",
    }
    assert Delta().to_dict() == {}
    assert Delta(content="a").to_dict() == {"content": "a"}
    assert Delta(reasoning_content="").to_dict() == {"reasoning_content": ""}
    head = ToolCallDelta(index=0, id="x", type="function", name="f", arguments="")
    assert head.to_dict() == {
        "index": 0,
        "id": "x",
        "type": "function",
        "function": {"name": "f", "arguments": ""},
    }
    assert ToolCallDelta(index=1, arguments="{}").to_dict() == {"index": 1, "function": {"arguments": "{}"}}
    assert ToolCallDelta(index=2).to_dict() == {"index": 2}
    assert (call.function.name, call.function.arguments) == ("f", "{}")  # OpenAI-client style access
    assert (head.function.name, head.function.arguments) == ("f", "")


def test_call_ids_are_unique_and_well_formed():
    ids = {new_call_id() for _ in range(2000)}
    assert len(ids) == 2000 and all(CALL_ID.fullmatch(i) for i in ids)
    text = FC + "".join(f"\n{I('f')}\n\n{IE}" for _ in range(50)) + "\n" + FCE
    out = OutputParser().parse(text)
    assert len({c.id for c in out.tool_calls}) == 50


def test_stream_api_misuse_and_idempotent_finish():
    stream = OutputParser().stream()
    assert stream.feed("") == []
    stream.feed("Hi")
    deltas, reason = stream.finish()
    assert (deltas, reason) == ([], "stop")
    assert stream.finish(truncated=True) == ([], "stop")
    with pytest.raises(RuntimeError):
        stream.feed("more")


def test_reasoning_parsers_standalone():
    assert DeepSeekR1ReasoningParser().parse("<think>a</think>b") == ("a", "b")
    assert DeepSeekR1ReasoningParser().parse("all reasoning") == ("all reasoning", None)
    assert DeepSeekV3ReasoningParser(thinking=True).parse("a</think>b") == ("a", "b")
    assert DeepSeekV3ReasoningParser(thinking=False).parse("a</think>b") == (None, "a</think>b")
    assert DeepSeekV3ReasoningParser().starts_in_reasoning is False


def test_tool_parser_event_api():
    parser = DeepSeekV32ToolParser()
    text = f"Hi\n\n{FC}\n{I('f')}\n{P('a', 'true')}x{PE}\n{P('n', 'false')}1{PE}\n{IE}\n{FCE}"
    events = [e for piece in (text[:20], text[20:]) for e in parser.feed(piece)] + parser.finish()
    assert events[0] == Event(TEXT, "Hi\n\n")
    assert [e.kind for e in events[1:3]] == [BLOCK, CALL] and events[2].value == "f"
    assert json.loads("".join(e.value for e in events if e.kind == ARGS)) == {"a": "x", "n": 1}
    assert events[-1] == Event(END)
