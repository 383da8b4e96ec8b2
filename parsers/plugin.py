"""The ``deepseek`` parser plugin: V3.2 encoders, tool-call parsers and reasoning parsers.

Published under the ``dsa_runtime.parsers`` entry-point group (``deepseek = "dsa_runtime.parsers.plugin"``).
Factories are ``"module:attr"`` strings, so registering imports nothing. :func:`get_tool_parser` and
:func:`get_reasoning_parser` resolve names and aliases from this plugin's own table.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from dsa_runtime.errors import ConfigError
from dsa_runtime.hookspecs import hookimpl
from dsa_runtime.parser_spec import ParserKind, ParserSpec

_P = "dsa_runtime.parsers."

PARSERS: tuple[ParserSpec, ...] = (
    ParserSpec(
        "deepseekv32",
        "encoder",
        _P + "encoding_v32:encode_messages",
        aliases=("deepseek_v32",),
        description="DeepSeek-V3.2 chat encoding (official encoding_dsv32 rules)",
    ),
    ParserSpec(
        "jinja", "encoder", _P + "jinja_template:render_chat_template", description="a Jinja chat template"
    ),
    ParserSpec(
        "deepseekv32",
        "tool",
        _P + "tool_parsers:DeepSeekV32ToolParser",
        aliases=("deepseek_v32",),
        description="DeepSeek-V3.2 DSML tool calls (also reads V3.1 special-token calls)",
    ),
    ParserSpec(
        "deepseekv31",
        "tool",
        _P + "tool_parsers:DeepSeekV31ToolParser",
        aliases=("deepseek_v31",),
        description="DeepSeek-V3.1 / V3.2-Exp special-token tool calls (also reads DSML)",
    ),
    ParserSpec(
        "deepseekv3",
        "tool",
        _P + "tool_parsers:DeepSeekV3ToolParser",
        aliases=("deepseek_v3",),
        description="DeepSeek-V3 / R1-0528 fenced special-token tool calls",
    ),
    ParserSpec(
        "deepseek-r1",
        "reasoning",
        _P + "reasoning:DeepSeekR1ReasoningParser",
        aliases=("deepseek_r1",),
        description="reasoning until </think>, always",
    ),
    ParserSpec(
        "deepseek-v3",
        "reasoning",
        _P + "reasoning:DeepSeekV3ReasoningParser",
        aliases=("deepseek_v3",),
        description="V3.1/V3.2: reasoning until </think> when thinking was requested, else none",
    ),
)


@hookimpl
def dsa_register_parsers(register: Callable[..., None]) -> None:
    for spec in PARSERS:
        register(spec)


def resolve_spec(kind: ParserKind, name: str) -> ParserSpec:
    """The spec of ``kind`` called ``name`` (or an alias of it); ConfigError listing valid names otherwise."""
    specs = [s for s in PARSERS if s.kind == kind]
    for spec in specs:
        if name == spec.name or name in spec.aliases:
            return spec
    valid = ", ".join(
        spec.name + (f" (alias {', '.join(spec.aliases)})" if spec.aliases else "") for spec in specs
    )
    raise ConfigError(f"unknown {kind} parser {name!r}; valid: {valid}")


def load_factory(spec: ParserSpec) -> object:
    """Import a spec's ``"module:attr"`` factory (or return a callable one as it is)."""
    if not isinstance(spec.factory, str):
        return spec.factory
    module_name, _, attr = spec.factory.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def get_tool_parser(name: str) -> type:
    """The tool-parser class registered as ``name`` (``deepseekv32``, ``deepseek_v31``...)."""
    return load_factory(resolve_spec("tool", name))  # type: ignore[return-value]


def get_reasoning_parser(name: str) -> type:
    """The reasoning-parser class registered as ``name`` (``deepseek-r1``, ``deepseek-v3``)."""
    return load_factory(resolve_spec("reasoning", name))  # type: ignore[return-value]
