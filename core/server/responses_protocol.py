"""The body of ``POST /v1/responses`` (OpenAI's Responses API), validated with pydantic like the chat body.

Types are strict (a 400 naming the field). Fields of the API this server does not implement are a 400 naming
them when they ask for something (:data:`UNSUPPORTED`); hints with no effect on the answer (``service_tier``,
``prompt_cache_key``, ``safety_identifier``, ``user``, ``stream_options``) are accepted, and unknown fields are
ignored as vendor extras, as on the chat endpoint.
"""

from __future__ import annotations

from typing import Any

from pydantic import StrictBool, StrictInt, StrictStr

from dsa_runtime.server.errors import bad_request
from dsa_runtime.server.protocol import Body, Number

# Values of ``include`` that need nothing from the server: the reasoning is returned as plain text
# (``content[].reasoning_text``), so there is nothing to encrypt; agents that always send this keep working.
_HARMLESS_INCLUDES = frozenset({"reasoning.encrypted_content"})


class ReasoningParam(Body):
    effort: StrictStr | None = None
    summary: StrictStr | None = None  # accepted; the full reasoning text is returned instead of a summary


class TextParam(Body):
    format: dict[str, Any] | None = None
    verbosity: StrictStr | None = None  # accepted; the model has one register


class ResponsesRequest(Body):
    model: StrictStr | None = None
    input: StrictStr | list[dict[str, Any]]
    instructions: StrictStr | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    reasoning: ReasoningParam | None = None
    text: TextParam | None = None
    max_output_tokens: StrictInt | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    stream: StrictBool = False
    store: StrictBool = True
    previous_response_id: StrictStr | None = None
    metadata: dict[str, StrictStr] | None = None
    # vLLM / SGLang sampling extras, as on the chat endpoint
    top_k: StrictInt | None = None
    min_p: Number | None = None
    seed: StrictInt | None = None


def _asks_for(name: str, value: Any) -> bool:
    """Whether an unimplemented field's value asks for something (its off / default values do not)."""
    if value is None or value is False:
        return False
    if name == "include":
        return not (isinstance(value, list) and set(value) <= _HARMLESS_INCLUDES)
    if name == "truncation":
        return value != "disabled"
    if name == "top_logprobs":
        return value != 0
    return True


UNSUPPORTED = ("background", "conversation", "prompt", "context_management", "include", "top_logprobs",
               "truncation", "image", "moderation")


def check_supported(req: ResponsesRequest) -> None:
    """400 naming the first field this server cannot honour."""
    extra = req.model_extra or {}
    for name in UNSUPPORTED:
        if name in extra and _asks_for(name, extra[name]):
            raise bad_request(f"'{name}' is not supported by this server (value {extra[name]!r})", param=name)
