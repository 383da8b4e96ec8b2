"""``POST /v1/chat/completions``: prompt encoding, sampling, tool-call and reasoning parsing, SSE streaming.

Streamed and whole responses run the same :class:`~dsa_runtime.parsers.stream.StreamParser` over the same
detokenized text, so a streamed answer's concatenated deltas equal the whole answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from dsa_runtime.server.errors import APIError, bad_request, server_error, unavailable
from dsa_runtime.server.logprobs import chat_logprobs
from dsa_runtime.server.protocol import ChatCompletionRequest, parse_body
from dsa_runtime.server.state import (
    ServerState,
    check_n,
    generate,
    new_id,
    resolve_max_tokens,
    sampling_params,
)
from dsa_runtime.server.structured import structured_output_of, tool_call_constraint

logger = logging.getLogger(__name__)

_EFFORT_OFF = ("none",)


def thinking_requested(req: ChatCompletionRequest) -> bool:
    """``chat_template_kwargs.thinking`` (or ``enable_thinking``), else ``reasoning_effort`` other than none."""
    kwargs = req.chat_template_kwargs or {}
    for key in ("thinking", "enable_thinking"):
        if key in kwargs:
            value = kwargs[key]
            if not isinstance(value, bool):
                raise bad_request(f"chat_template_kwargs.{key} must be a boolean", param=f"chat_template_kwargs.{key}")
            return value
    if req.reasoning_effort is not None:
        return req.reasoning_effort.lower() not in _EFFORT_OFF
    return False


def resolve_choice(state: ServerState, req: ChatCompletionRequest) -> Any:
    """The request's resolved ``tool_choice`` (:class:`~dsa_runtime.parsers.tool_choice.ToolChoice`); 400 if bad.

    ``none`` hides the tools and turns call parsing off; ``required`` and a named choice force the reply to
    open a tool call in the model's format (a named choice also shows only that tool).
    """
    from dsa_runtime.parsers.tool_choice import ToolChoiceError, resolve_tool_choice

    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    try:
        choice = resolve_tool_choice(tools, req.tool_choice, state.flavor.tool_parser or "deepseekv32")
    except ToolChoiceError as exc:
        raise bad_request(str(exc), param="tool_choice") from None
    if choice.forced and state.tool_parser is None:
        raise bad_request(
            f"tool_choice '{choice.mode}' needs a tool-call parser (this server runs with --tool-call-parser none)",
            param="tool_choice",
        )
    return choice


class ChatRun:
    """One validated chat request, ready to generate."""

    def __init__(self, state: ServerState, body: Any) -> None:
        req = parse_body(ChatCompletionRequest, body)
        state.check_model(req.model)
        check_n(req.n)
        self.state, self.req = state, req
        self.id, self.created = new_id("chatcmpl"), int(time.time())
        self.arrival = time.monotonic()
        self.cached_tokens: dict[int, int] = {}  # choice -> prompt tokens its request found in the prefix cache
        self.completion_tokens = 0  # over the choices that finished
        choice = resolve_choice(state, req)
        self.tool_parser = state.tool_parser if choice.parse_calls else None
        # A forced tool call opens the reply, so it is written without reasoning (parsers/tool_choice.py).
        self.thinking = choice.thinking(thinking_requested(req))
        # The forced opening is prompt (counted in prompt_tokens) and the parser's first input.
        self.forced = choice.forced
        text = state.prompts.render(req.messages, tools=choice.tools, thinking=self.thinking)
        self.prompt_ids = state.prompts.encode(text + self.forced, max_len=state.max_model_len)
        requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        max_tokens = resolve_max_tokens(state, requested, len(self.prompt_ids), None)
        top = req.top_logprobs
        if top is not None and not 0 <= top <= 20:
            raise bad_request(f"top_logprobs must be between 0 and 20, got {top}", param="top_logprobs")
        if top is not None and not req.logprobs:
            raise bad_request("top_logprobs needs logprobs=true", param="top_logprobs")
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        structured = structured_output_of(req)
        if structured is not None and self.forced:
            raise bad_request("an output constraint (response_format / guided_*) cannot be combined with a "
                              "forced tool call", param="tool_choice")
        if structured is None:  # a forced call, or a strict tool's, has schema-valid arguments
            structured = tool_call_constraint(choice, self.tool_parser, req.parallel_tool_calls is not False)
        if structured is not None and self.thinking:  # the reasoning stays free: constrained after </think>
            structured = dataclasses.replace(structured, after_token_id=state.tokenizer.token_to_id("</think>"))
        self.params = [
            sampling_params(
                max_tokens=max_tokens,
                temperature=1.0 if req.temperature is None else float(req.temperature),
                top_p=1.0 if req.top_p is None else float(req.top_p),
                top_k=req.top_k or 0,
                min_p=0.0 if req.min_p is None else float(req.min_p),
                seed=None if req.seed is None else req.seed + j,
                stop=stop,
                stop_token_ids=list(req.stop_token_ids or []),
                ignore_eos=req.ignore_eos,
                logprobs=(top or 0) if req.logprobs else None,
                include_stop_str_in_output=req.include_stop_str_in_output,
                # The parsers need the markup tokens (V3.1 tool-call tokens are special tokens; upstream bug 14).
                skip_special_tokens=False,
                structured=structured,
            )
            for j in range(req.n)
        ]

    def parser(self) -> tuple[Any, list[Any]]:
        """A fresh stream parser for one choice, already fed the forced opening, and the deltas that made."""
        from dsa_runtime.parsers import OutputParser

        stream = OutputParser(self.tool_parser, self.state.reasoning_parser, thinking=self.thinking).stream()
        return stream, stream.feed(self.forced) if self.forced else []

    def delta_dict(self, delta: Any) -> dict[str, Any]:
        d = delta.to_dict()
        if self.state.config.reasoning_field_alias and "reasoning_content" in d:
            d["reasoning"] = d["reasoning_content"]
        return d

    def usage(self, completion_tokens: int) -> dict[str, Any]:
        prompt = len(self.prompt_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                "total_tokens": prompt + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": max(self.cached_tokens.values(), default=0)}}

    def outputs(self) -> AsyncIterator[tuple[int, Any]]:
        gens = [
            generate(self.state, self.prompt_ids, p, f"{self.id}-{j}", self.arrival) for j, p in enumerate(self.params)
        ]
        return merge(gens)

    async def parsed(self, streams: list[Any]) -> AsyncIterator[tuple[int, Any, list[Any], str | None]]:
        """``(choice, engine output, deltas, finish reason)`` for every output of every choice: the deltas its
        text parsed into (on a choice's last output the parser's flushed tail too) and, on that last output,
        the finish reason. Counts the choice's tokens, cached prompt tokens and call parse errors; an aborted
        request (server shutting down) is a 503."""
        async for j, out in self.outputs():
            deltas = streams[j].feed(out.new_text)
            reason = None
            if out.finished:
                if out.finish_reason == "abort":
                    raise unavailable("the request was aborted (server shutting down)")
                tail, reason = streams[j].finish(truncated=out.finish_reason == "length")
                deltas += tail
                self.state.metrics.tool_call_parse_errors.inc(streams[j].parse_errors)
                self.completion_tokens += len(out.token_ids)
                self.cached_tokens[j] = out.num_cached_tokens
            yield j, out, deltas, reason

    # -- whole response -----------------------------------------------------------------------------------
    async def response(self) -> dict[str, Any]:
        started = [self.parser() for _ in self.params]
        streams = [stream for stream, _ in started]
        deltas: list[list[Any]] = [list(first) for _, first in started]
        logprobs: list[list[Any]] = [[] for _ in self.params]
        choices: list[dict[str, Any] | None] = [None] * len(self.params)
        async for j, out, new, reason in self.parsed(streams):
            deltas[j] += new
            logprobs[j] += out.logprobs or []
            if reason is not None:
                choices[j] = self._choice(j, deltas[j], reason, streams[j], logprobs[j])
        return {
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.state.model_name,
            "choices": choices, "usage": self.usage(self.completion_tokens),
        }

    def _choice(self, j: int, deltas: list[Any], reason: str, stream: Any, logprobs: list[Any]) -> dict[str, Any]:
        from dsa_runtime.parsers.stream import collect

        parsed = collect(deltas, reason, stream.completed_calls)
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content,
                                   "reasoning_content": parsed.reasoning_content}
        if self.state.config.reasoning_field_alias:
            message["reasoning"] = parsed.reasoning_content
        if parsed.tool_calls:
            message["tool_calls"] = [call.to_dict() for call in parsed.tool_calls]
        choice: dict[str, Any] = {"index": j, "message": message, "logprobs": None, "finish_reason": reason}
        if self.req.logprobs:
            choice["logprobs"] = chat_logprobs(self.state.tokenizer, logprobs)
        return choice

    # -- streamed response ----------------------------------------------------------------------------------
    async def sse(self) -> AsyncIterator[str]:
        include_usage = bool(self.req.stream_options and self.req.stream_options.include_usage)
        started = [self.parser() for _ in self.params]
        streams = [stream for stream, _ in started]
        try:
            for j in range(len(self.params)):
                yield self._chunk(j, {"role": "assistant", "content": ""}, None, include_usage)
                for delta in started[j][1]:  # the forced opening's deltas (a named call's header)
                    yield self._chunk(j, self.delta_dict(delta), None, include_usage)
            async for j, out, deltas, reason in self.parsed(streams):
                lp = chat_logprobs(self.state.tokenizer, out.logprobs) if self.req.logprobs and out.logprobs else None
                for k, delta in enumerate(deltas):
                    yield self._chunk(j, self.delta_dict(delta), None, include_usage, lp if k == 0 else None)
                if lp is not None and not deltas:
                    yield self._chunk(j, {}, None, include_usage, lp)
                if reason is not None:
                    yield self._chunk(j, {}, reason, include_usage)
            if include_usage:
                yield _event({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                              "model": self.state.model_name, "choices": [],
                              "usage": self.usage(self.completion_tokens)})
        except APIError as exc:
            yield exc.sse()
        except Exception:  # noqa: BLE001 - the stream must end with an error event, not a cut connection
            logger.exception("chat stream %s failed", self.id)
            yield server_error("internal error while generating").sse()
        yield "data: [DONE]\n\n"

    def _chunk(
        self, j: int, delta: dict[str, Any], reason: str | None, include_usage: bool, logprobs: Any = None
    ) -> str:
        chunk: dict[str, Any] = {
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.state.model_name,
            "choices": [{"index": j, "delta": delta, "logprobs": logprobs, "finish_reason": reason}],
        }
        if include_usage:
            chunk["usage"] = None
        return _event(chunk)


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def merge(gens: list[AsyncIterator[Any]]) -> AsyncIterator[tuple[int, Any]]:
    """Interleave several generators' items as ``(index, item)``; an error in one ends the merge."""
    if len(gens) == 1:
        async for item in gens[0]:
            yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(j: int, gen: AsyncIterator[Any]) -> None:
        try:
            async for item in gen:
                await queue.put((j, item))
            await queue.put((j, done))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            await queue.put((j, exc))

    tasks = [asyncio.create_task(pump(j, g)) for j, g in enumerate(gens)]
    remaining = len(gens)
    try:
        while remaining:
            j, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield j, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
