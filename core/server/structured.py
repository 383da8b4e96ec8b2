"""Structured-output fields of a request -> the engine's :class:`StructuredOutput`, or a 400 naming the field.

OpenAI's ``response_format`` (``text``, ``json_object``, ``json_schema``) and vLLM's extras (``guided_json``,
``guided_regex``, ``guided_choice``, ``guided_grammar``, and ``structured_outputs`` with ``json`` / ``regex`` /
``choice`` / ``grammar`` / ``json_object``) are accepted; at most one constraint per request. The grammar is
checked here, before anything is queued: an invalid schema, regex or grammar is the client's mistake (400),
a server without xgrammar answers 501.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from typing import Any

from dsa_runtime.engine.structured import INSTALL_HINT, KIND_NAMES, StructuredOutput
from dsa_runtime.server.errors import APIError, bad_request

_REGEX_SPECIAL = set("\\.^$|?*+()[]{}/-")


def structured_output_of(req: Any) -> StructuredOutput | None:
    """The request's constraint (None: free text), checked."""
    found: list[tuple[str, StructuredOutput]] = []
    fmt = req.response_format
    if fmt is not None:
        spec = _from_response_format(fmt)
        if spec is not None:
            found.append(("response_format", spec))
    extras = req.model_extra or {}
    for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar"):
        if extras.get(name) is not None:
            found.append((name, _from_vllm(name, name.removeprefix("guided_"), extras[name])))
    so = extras.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict):
            raise bad_request("structured_outputs must be an object", param="structured_outputs")
        keys = [k for k in ("json", "regex", "choice", "grammar", "json_object") if so.get(k) not in (None, False)]
        if len(keys) != 1:
            raise bad_request("structured_outputs must set exactly one of json, regex, choice, grammar, json_object",
                              param="structured_outputs")
        found.append(("structured_outputs", _from_vllm(f"structured_outputs.{keys[0]}", keys[0], so[keys[0]])))
    if len(found) > 1:
        raise bad_request(f"one output constraint per request, got {' and '.join(n for n, _ in found)}",
                          param=found[1][0])
    if not found:
        return None
    name, spec = found[0]
    check_grammar(spec, name)
    return spec


def _from_response_format(fmt: Any) -> StructuredOutput | None:
    if not isinstance(fmt, dict):
        raise bad_request("response_format must be an object", param="response_format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput("json_object")
    if kind == "json_schema":
        inner = fmt.get("json_schema")
        if not isinstance(inner, dict):
            raise bad_request("response_format.json_schema must be an object with a 'schema'",
                              param="response_format.json_schema")
        schema = inner.get("schema", inner.get("json_schema"))
        if not isinstance(schema, dict):
            raise bad_request("response_format.json_schema.schema must be a JSON schema object",
                              param="response_format.json_schema.schema")
        return StructuredOutput.json_schema(schema)
    raise bad_request(f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
                      param="response_format.type")


def _from_vllm(param: str, kind: str, value: Any) -> StructuredOutput:
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise bad_request(f"{param} is not valid JSON: {exc.msg}", param=param) from None
        if not isinstance(value, dict):
            raise bad_request(f"{param} must be a JSON schema object", param=param)
        return StructuredOutput.json_schema(value)
    if kind == "json_object":
        return StructuredOutput("json_object")
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise bad_request(f"{param} must be a non-empty list of non-empty strings", param=param)
        return StructuredOutput("regex", "(" + "|".join(_regex_literal(c) for c in value) + ")")
    if not isinstance(value, str) or not value:
        raise bad_request(f"{param} must be a non-empty string", param=param)
    return StructuredOutput("regex" if kind == "regex" else "ebnf", value)


def _regex_literal(text: str) -> str:
    return "".join("\\" + c if c in _REGEX_SPECIAL else c for c in text)


def check_grammar(spec: StructuredOutput, param: str) -> None:
    """Parse the grammar without a tokenizer (cheap): 400 naming ``param`` when it is invalid, 501 without
    xgrammar."""
    try:
        import xgrammar as xgr
    except ImportError:
        raise APIError(INSTALL_HINT, status=501, param=param, code="structured_output_unavailable") from None
    try:
        if spec.kind == "json_schema":
            xgr.Grammar.from_json_schema(spec.spec, any_whitespace=False, strict_mode=True)
        elif spec.kind == "regex":
            xgr.Grammar.from_regex(spec.spec)
        elif spec.kind == "ebnf":
            xgr.Grammar.from_ebnf(spec.spec)
        elif spec.kind == "structural_tag":
            xgr.Grammar.from_structural_tag(spec.spec)
    except Exception as exc:  # noqa: BLE001 - xgrammar's errors for bad input
        what = "tool parameters schema" if spec.kind == "structural_tag" else KIND_NAMES[spec.kind]
        detail = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise bad_request(f"invalid {what} in {param}: {detail}", param=param) from None


def tool_call_constraint(choice: Any, call_format: str | None, parallel: bool = True) -> StructuredOutput | None:
    """The grammar of a reply's tool calls in the model's format (V3.2 DSML, V3.1, V3 / R1), or None: no forced
    call and no strict tool, no call parser, or no xgrammar (the forced opening alone then steers the model).

    The prompt already ends with a forced call's opening (:attr:`ToolChoice.forced`). A named choice continues
    with that function's arguments (DSML parameters, each value matching its schema: xgrammar's
    ``deepseek_xml`` style; JSON for V3.1 / V3), then closes the call and the block. ``required`` writes one or
    more calls of the listed functions, then closes the block. ``auto`` with a tool marked ``"strict": true``
    leaves the reply free until a call block opens; in the block, strict tools' arguments match their schemas
    and the other tools take any object. ``parallel=False`` (``parallel_tool_calls: false``): one call a block.
    """
    if not call_format or importlib.util.find_spec("xgrammar") is None:
        return None
    from dsa_runtime.parsers.dsml_render import function_schemas
    from dsa_runtime.parsers.plugin import resolve_spec

    functions = function_schemas(choice.tools or [])
    strict = {f["name"] for f in functions if f.get("strict") is True}
    if not choice.forced and not (choice.mode == "auto" and strict):
        return None
    fmt = _CallFormat.of(resolve_spec("tool", call_format).name)

    def arguments(fn: Any, checked: bool = True) -> dict[str, Any]:
        schema = (fn.get("parameters") or {"type": "object", "properties": {}}) if checked else {"type": "object"}
        # At most one whitespace character where JSON allows any: a sampled model would otherwise spend its
        # budget on blank lines between the values. (No ``excludes`` of the format's markers: xgrammar 0.2.8
        # drops a string's length bounds when it has them.)
        return {"type": "json_schema", "json_schema": schema, "style": fmt.style, "max_whitespace_cnt": 1}

    calls = {"type": "tags_with_separator", "separator": fmt.separator, "at_least_one": True,
             "stop_after_first": not parallel, "tags": [
        {"type": "tag", "begin": fmt.call_begin(f["name"]),
         "content": arguments(f, checked=choice.forced != "" or f["name"] in strict), "end": fmt.call_end}
        for f in functions]}
    if choice.function is not None:
        fn = next(f for f in functions if f["name"] == choice.function)
        grammar = {"type": "sequence", "elements": [
            arguments(fn), {"type": "const_string", "value": fmt.call_end + fmt.block_end}]}
    elif choice.forced:
        grammar = {"type": "sequence", "elements": [calls, {"type": "const_string", "value": fmt.block_end}]}
    else:
        grammar = {"type": "triggered_tags", "triggers": [fmt.trigger], "tags": [
            {"type": "tag", "begin": fmt.block_begin, "content": calls, "end": fmt.block_end}]}
    spec = StructuredOutput("structural_tag", json.dumps({"type": "structural_tag", "format": grammar}))
    check_grammar(spec, "tools")
    return spec


@dataclass(frozen=True)
class _CallFormat:
    """How one tool-call format writes a block of calls (the texts the forced openings end with)."""

    style: str  # xgrammar's style for the arguments
    block_begin: str
    block_end: str
    trigger: str  # what opens a block in free text
    call_prefix: str
    call_suffix: str  # after the name
    call_end: str
    separator: str  # between calls

    def call_begin(self, name: str) -> str:
        return self.call_prefix + name + self.call_suffix

    @staticmethod
    def of(name: str) -> _CallFormat:
        from dsa_runtime.parsers.markers import (
            TOOL_CALL_BEGIN,
            TOOL_CALL_END,
            TOOL_CALLS_BEGIN,
            TOOL_CALLS_END,
            TOOL_SEP,
        )
        from dsa_runtime.parsers.tools_prompt_v32 import (
            DSML,
            FUNCTION_CALLS_END,
            FUNCTION_CALLS_START,
            INVOKE_END,
        )

        if name == "deepseekv32":  # after "\n\n" + block_begin; calls one per line, as parsers/dsml.py reads them
            return _CallFormat("deepseek_xml", FUNCTION_CALLS_START + "\n", FUNCTION_CALLS_END, FUNCTION_CALLS_START,
                               f'<{DSML}invoke name="', '">\n', INVOKE_END + "\n", "")
        if name == "deepseekv31":
            return _CallFormat("json", TOOL_CALLS_BEGIN, TOOL_CALLS_END, TOOL_CALLS_BEGIN, TOOL_CALL_BEGIN, TOOL_SEP,
                               TOOL_CALL_END, "")
        return _CallFormat("json", TOOL_CALLS_BEGIN, TOOL_CALLS_END, TOOL_CALLS_BEGIN,
                           TOOL_CALL_BEGIN + "function" + TOOL_SEP, "\n```json\n", "\n```" + TOOL_CALL_END, "\n")
