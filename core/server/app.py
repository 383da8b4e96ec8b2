"""The FastAPI application: OpenAI endpoints plus health, tokenizer and Prometheus routes.

``build_app(state)`` needs only a :class:`ServerState` (an ``AsyncEngine`` over anything with the Engine
interface), so tests serve a scripted engine through exactly the code that serves the real one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from dsa_runtime.server.errors import APIError, bad_request, server_error
from dsa_runtime.server.http import (
    DisconnectAwareStream,
    DrainGate,
    cancel_on_disconnect,
    check_api_key,
    read_json,
)
from dsa_runtime.server.protocol import DetokenizeRequest, TokenizeRequest, parse_body
from dsa_runtime.server.serving_chat import ChatRun
from dsa_runtime.server.serving_completions import CompletionRun
from dsa_runtime.server.serving_responses import ResponsesRun
from dsa_runtime.server.state import ServerState, new_id, sampling_params

logger = logging.getLogger(__name__)

HEALTH_GENERATE_TIMEOUT_S = 20.0
_IDS_PER_SLICE = 65536  # ~5 ms of json.dumps each


def _error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def build_app(state: ServerState) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.engine.start()
        yield
        # uvicorn has drained (or cancelled) the requests by now; abort whatever is left and stop the thread.
        await state.engine.shutdown(drain_timeout=0.0)

    app = FastAPI(title="dsa-runtime", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.server = state
    app.add_middleware(DrainGate, state=state)
    limit = state.config.max_request_bytes

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return _error_response(APIError(str(exc.detail), status=exc.status_code, type=kind))

    @app.exception_handler(RecursionError)
    async def _too_deep(_: Request, exc: RecursionError) -> JSONResponse:
        # read_json caps nesting well below the interpreter's limit, so this needs a request shape that cap
        # missed; the shape is still the client's, so it is a 400 (and logged, to find the gap).
        logger.warning("RecursionError while handling a request: %s", exc)
        return _error_response(bad_request("request is nested too deeply to process"))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        response = _error_response(server_error(f"internal error: {type(exc).__name__}"))
        # Starlette re-raises after this response and uvicorn then drops the connection: without this header a
        # keep-alive client would send its next request down the dead connection and get a reset.
        response.headers["Connection"] = "close"
        return response

    async def _run(request: Request, run: Any) -> Response:
        if run.req.stream:
            return DisconnectAwareStream(run.sse())
        result = await cancel_on_disconnect(request, run.response())
        if result is None:  # client gone: the request was aborted, nobody reads this
            return Response(status_code=499)
        return JSONResponse(result)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        check_api_key(request, state.config.api_key)
        body = await read_json(request, limit)
        # Rendering and tokenizing take seconds for a multi-MB prompt: off the event loop, so /health and other
        # clients' requests keep answering meanwhile (the tokenizer releases the GIL: PromptBuilder.encode).
        return await _run(request, await asyncio.to_thread(ChatRun, state, body))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        check_api_key(request, state.config.api_key)
        body = await read_json(request, limit)
        return await _run(request, await asyncio.to_thread(CompletionRun, state, body))  # as chat, off the loop

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        check_api_key(request, state.config.api_key)
        body = await read_json(request, limit)
        return await _run(request, await asyncio.to_thread(ResponsesRun, state, body))  # as chat, off the loop

    @app.get("/v1/responses/{response_id}")
    async def stored_response(request: Request, response_id: str) -> JSONResponse:
        check_api_key(request, state.config.api_key)
        return JSONResponse(state.responses.get(response_id).response)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(request: Request, response_id: str) -> JSONResponse:
        check_api_key(request, state.config.api_key)
        state.responses.delete(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        check_api_key(request, state.config.api_key)
        card = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "dsa-runtime",
                "root": state.model_name, "max_model_len": state.max_model_len}
        return JSONResponse({"object": "list", "data": [card]})

    @app.get("/health")
    async def health() -> Response:
        if not state.engine.is_running:
            return _error_response(APIError("engine is not running", status=503, type="server_error"))
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        prompt = state.prompts.encode("hi") or [0]
        params = sampling_params(max_tokens=1, temperature=0.0)

        async def run() -> None:
            async for _ in state.engine.generate(prompt, params, new_id("health")):
                pass

        try:
            await asyncio.wait_for(run(), HEALTH_GENERATE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - any failure means unhealthy
            return _error_response(APIError(f"generation failed: {exc}", status=503, type="server_error"))
        return Response(status_code=200)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        check_api_key(request, state.config.api_key)
        body = await read_json(request, limit)
        return await asyncio.to_thread(_tokenize, state, body)  # off the loop, as chat prompts are

    @app.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        check_api_key(request, state.config.api_key)
        req = parse_body(DetokenizeRequest, await read_json(request, limit))
        state.check_model(req.model)
        vocab = state.tokenizer.vocab_size
        if any(not 0 <= t < vocab for t in req.tokens):
            raise bad_request(f"token ids must be in [0, {vocab})", param="tokens")
        return JSONResponse({"prompt": state.tokenizer.decode(req.tokens, skip_special_tokens=False)})

    @app.get("/metrics")
    async def metrics() -> Response:
        body, content_type = state.metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/version")
    async def version() -> JSONResponse:
        from dsa_runtime import __version__

        return JSONResponse({"version": __version__, "time": int(time.time())})

    return app


def _tokenize(state: ServerState, body: Any) -> Response:
    """``POST /tokenize``: the tokens of a prompt, or of messages rendered as a chat prompt."""
    req = parse_body(TokenizeRequest, body)
    state.check_model(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise bad_request("send exactly one of 'prompt' or 'messages'")
    if req.messages is not None:
        kwargs = req.model_extra.get("chat_template_kwargs") or {}
        text = state.prompts.render(req.messages, tools=req.model_extra.get("tools"),
                                    thinking=bool(kwargs.get("thinking")),
                                    add_generation_prompt=req.add_generation_prompt)
    else:
        text = req.prompt
    tokens = state.prompts.encode(text)
    if req.add_special_tokens:  # whatever the tokenizer adds in front (DeepSeek: BOS), as its encode() would
        tokens = state.tokenizer.encode("", add_special_tokens=True) + tokens
    body = f'{{"tokens":{_ids_json(tokens)},"count":{len(tokens)},"max_model_len":{state.max_model_len}}}'
    return Response(body, media_type="application/json")


def _ids_json(ids: list[int]) -> str:
    """``json.dumps(ids)``, in slices: one call over millions of ids holds the GIL for a quarter of a second
    (stalling the event loop even from a worker thread); between slices other threads get their turn."""
    return "[" + ",".join(json.dumps(ids[i : i + _IDS_PER_SLICE], separators=(",", ":"))[1:-1]
                          for i in range(0, len(ids), _IDS_PER_SLICE)) + "]"
