"""``POST /v1/responses`` (OpenAI's Responses API) on the chat path's engine, renderer and parsers.

The request becomes a chat request (:mod:`~dsa_runtime.server.responses_input`), so prompts, tools,
``tool_choice``, thinking, structured output and sampling are the chat endpoint's; the parsed deltas become
output items and typed events (:mod:`~dsa_runtime.server.responses_output`). ``store`` keeps the answer for
``previous_response_id`` and ``GET /v1/responses/{id}`` (:mod:`~dsa_runtime.server.response_store`).
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from dsa_runtime.server.errors import APIError, bad_request, server_error
from dsa_runtime.server.protocol import parse_body
from dsa_runtime.server.response_store import StoredResponse
from dsa_runtime.server.responses_input import (
    chat_response_format,
    chat_tool_choice,
    chat_tools,
    check_effort,
    input_items,
    renamed,
    to_messages,
)
from dsa_runtime.server.responses_output import OutputItems
from dsa_runtime.server.responses_protocol import ResponsesRequest, check_supported
from dsa_runtime.server.serving_chat import ChatRun
from dsa_runtime.server.state import ServerState, new_id

logger = logging.getLogger(__name__)


class ResponsesRun:
    """One validated Responses request, ready to generate (one output: the API has no ``n``)."""

    def __init__(self, state: ServerState, body: Any) -> None:
        req = parse_body(ResponsesRequest, body)
        check_supported(req)
        state.check_model(req.model)
        self.state, self.req = state, req
        self.id, self.created = new_id("resp", "_"), int(time.time())
        history: tuple[dict[str, Any], ...] = ()
        if req.previous_response_id is not None:
            history = state.responses.get(req.previous_response_id, "previous_response_id").conversation
        items = input_items(req.input)
        self.conversation = (*history, *items)  # what a continuation of this response starts from

        def where(i: int) -> str:
            if i < len(history):
                return "previous_response_id"
            return f"input.{i - len(history)}" if isinstance(req.input, list) else "input"

        messages = to_messages(list(self.conversation), where)
        if req.instructions:  # never carried over: each request states its own (OpenAI's rule)
            messages.insert(0, {"role": "system", "content": req.instructions})
        if not messages:
            raise bad_request("input must hold at least one item", param="input")
        self.effort = req.reasoning.effort if req.reasoning is not None else None
        check_effort(self.effort)
        if req.max_output_tokens is not None and req.max_output_tokens < 1:
            raise bad_request(f"max_output_tokens must be at least 1, got {req.max_output_tokens}",
                              param="max_output_tokens")
        chat = {
            "messages": messages, "tools": chat_tools(req.tools), "tool_choice": chat_tool_choice(req.tool_choice),
            "parallel_tool_calls": req.parallel_tool_calls, "reasoning_effort": self.effort,
            "response_format": chat_response_format(req.text.format if req.text is not None else None),
            "max_completion_tokens": req.max_output_tokens, "temperature": req.temperature, "top_p": req.top_p,
            "top_k": req.top_k, "min_p": req.min_p, "seed": req.seed,
        }
        try:
            self.chat = ChatRun(state, {k: v for k, v in chat.items() if v is not None})
        except APIError as exc:
            raise renamed(exc) from None
        self.reasoning_tokens = 0
        self._think_end = state.tokenizer.token_to_id("</think>") if self.chat.thinking else None
        self.truncated = False  # generation hit the token limit

    async def _generate(self, items: OutputItems) -> AsyncIterator[list[dict[str, Any]]]:
        """The events of each engine output; ``items`` holds the output so far, ``self.chat`` the token counts."""
        stream = items.stream
        thinking = stream.in_reasoning  # after the forced opening: the state the first output starts in
        async for _, out, deltas, reason in self.chat.parsed([stream]):
            if thinking:  # the output started inside the reasoning: its tokens up to </think> are reasoning
                ids = out.new_token_ids
                end = self._think_end
                # (a tool block that ends the reasoning without </think> counts its output's tokens whole)
                self.reasoning_tokens += ids.index(end) + 1 if end is not None and end in ids else len(ids)
            thinking = stream.in_reasoning
            events = items.feed(deltas)
            if reason is not None:
                self.truncated = reason == "length"
                events += items.finish(self.truncated)
            yield events

    def _start(self) -> tuple[OutputItems, list[dict[str, Any]]]:
        stream, first = self.chat.parser()
        items = OutputItems(stream)
        return items, items.feed(first)

    # -- whole response -----------------------------------------------------------------------------------
    async def response(self) -> dict[str, Any]:
        items, _ = self._start()
        async for _ in self._generate(items):
            pass
        return self._finish(items)

    # -- streamed response ----------------------------------------------------------------------------------
    async def sse(self) -> AsyncIterator[str]:
        numbers = itertools.count()

        def event(payload: dict[str, Any]) -> str:
            payload["sequence_number"] = next(numbers)
            return f"event: {payload['type']}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

        try:
            yield event({"type": "response.created", "response": self.body([], "in_progress")})
            yield event({"type": "response.in_progress", "response": self.body([], "in_progress")})
            items, first = self._start()
            for e in first:
                yield event(e)
            async for events in self._generate(items):
                for e in events:
                    yield event(e)
            body = self._finish(items)
            yield event({"type": f"response.{body['status']}", "response": body})
        except Exception as exc:  # noqa: BLE001 - the stream ends with error events, not a cut connection
            if not isinstance(exc, APIError):
                logger.exception("responses stream %s failed", self.id)
                exc = server_error("internal error while generating")
            yield event({"type": "error", "code": exc.code, "message": exc.message, "param": exc.param})
            failed = self.body([], "failed")
            # ResponseError's codes: the client's prompt, or the server
            failed["error"] = {"code": "invalid_prompt" if exc.status < 500 else "server_error", "message": exc.message}
            yield event({"type": "response.failed", "response": failed})

    # -- the Response object --------------------------------------------------------------------------------
    def _finish(self, items: OutputItems) -> dict[str, Any]:
        """The final Response (stored when ``store``)."""
        body = self.body(items.items, "incomplete" if self.truncated else "completed", self.usage())
        if self.req.store:
            self.state.responses.put(self.id, StoredResponse(body, (*self.conversation, *items.items)))
        return body

    def usage(self) -> dict[str, Any]:
        chat = self.chat.usage(self.chat.completion_tokens)
        return {
            "input_tokens": chat["prompt_tokens"], "output_tokens": chat["completion_tokens"],
            "total_tokens": chat["total_tokens"],
            # the prefix cache is automatic: a request writes nothing to it on request
            "input_tokens_details": {"cached_tokens": chat["prompt_tokens_details"]["cached_tokens"],
                                     "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
        }

    def body(self, output: list[dict[str, Any]], status: str, usage: dict[str, Any] | None = None) -> dict[str, Any]:
        req = self.req
        fmt = req.text.format if req.text is not None and req.text.format is not None else {"type": "text"}
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "model": self.state.model_name, "output": output,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": self.effort, "summary": None},
            "store": req.store, "temperature": 1.0 if req.temperature is None else req.temperature,
            "top_p": 1.0 if req.top_p is None else req.top_p, "max_output_tokens": req.max_output_tokens,
            "text": {"format": fmt}, "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "tools": req.tools or [], "truncation": "disabled", "metadata": req.metadata or {},
            "usage": usage,
        }
