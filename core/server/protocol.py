"""Request bodies of the OpenAI endpoints, validated with pydantic (strict types, unknown fields kept).

Field types are strict: a string where a number belongs is a 400 naming the field, not a silent coercion.
Unknown fields are accepted and ignored (clients send vendor extras), as vLLM and SGLang do.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from dsa_runtime.server.errors import APIError, bad_request

Number = StrictInt | StrictFloat


class Body(BaseModel):
    """A request body: strict field types, unknown fields kept (``model_extra``)."""

    model_config = ConfigDict(extra="allow", strict=True)


class StreamOptions(Body):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


class FunctionDef(Body):
    name: StrictStr
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None


class Tool(Body):
    type: Literal["function"] = "function"
    function: FunctionDef


class _Sampling(Body):
    model: StrictStr | None = None
    max_tokens: StrictInt | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    top_k: StrictInt | None = None
    min_p: Number | None = None
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    skip_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    user: StrictStr | None = None
    response_format: dict[str, Any] | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None
    tools: list[Tool] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: StrictStr | None = None
    separate_reasoning: StrictBool = True


class CompletionRequest(_Sampling):
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    logprobs: StrictInt | None = None
    echo: StrictBool = False
    suffix: StrictStr | None = None


class TokenizeRequest(Body):
    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: StrictBool = False
    add_generation_prompt: StrictBool = True


class DetokenizeRequest(Body):
    model: StrictStr | None = None
    tokens: list[StrictInt]


def parse_body(model: type[Body], payload: Any) -> Any:
    """Validate a decoded JSON body; the first problem becomes a 400 naming its field."""
    if not isinstance(payload, dict):
        raise bad_request("request body must be a JSON object")
    try:
        req = model.model_validate(payload)
    except ValidationError as exc:
        raise _first_error(exc) from None
    return req


def _first_error(exc: ValidationError) -> APIError:
    err = exc.errors(include_url=False)[0]
    loc = [str(p) for p in err.get("loc", ()) if not str(p).startswith(("function-", "list[", "dict["))]
    # pydantic names union members in the location (e.g. "str" / "list[str]"); drop them from the param.
    loc = [p for p in loc if p not in {"str", "int", "float", "bool"}]
    param = ".".join(loc) or None
    kind = err.get("type", "")
    if kind == "missing":
        message = f"missing required field '{param}'"
    else:
        message = f"invalid value for '{param}': {err.get('msg', 'bad value')}"
    return bad_request(message, param=param)
