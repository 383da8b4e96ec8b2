"""HTTP plumbing: bounded JSON bodies, API-key checks, and aborting work when the client goes away.

Disconnects are detected by listening for the ASGI ``http.disconnect`` message (as vLLM does), not by
polling ``request.is_disconnected()``: a non-streaming request races its handler against that message,
and :class:`DisconnectAwareStream` does the same for a stream whatever ASGI spec version the server
reports. Cancelling the handler cancels the ``AsyncEngine.generate`` loop, which aborts the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import Awaitable
from typing import Any, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from dsa_runtime.server.errors import APIError, unavailable
from dsa_runtime.server.json_body import decode_json

T = TypeVar("T")


async def read_json(request: Request, limit: int) -> Any:
    """The request body as JSON; 413 past ``limit`` bytes (checked while reading), 400 when not JSON, nested
    too deeply or holding a lone surrogate (:func:`~dsa_runtime.server.json_body.decode_json`)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    size, parts = 0, []
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise _too_large(limit)
        parts.append(part)
    # A worker thread: checking a multi-megabyte body's strings and nesting must not hold up other requests.
    return await asyncio.to_thread(decode_json, b"".join(parts))


def _too_large(limit: int) -> APIError:
    return APIError(f"request body exceeds the limit of {limit} bytes", status=413, code="request_too_large")


def check_api_key(request: Request, api_key: str | None) -> None:
    """401 unless ``Authorization: Bearer <api_key>`` (compared in constant time) when a key is set."""
    if api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    given = token.strip().encode() if scheme.lower() == "bearer" else b""
    if not hmac.compare_digest(given, api_key.encode()):
        raise APIError(
            "invalid or missing API key (send 'Authorization: Bearer <key>')",
            status=401, type="invalid_request_error", code="invalid_api_key",
        )


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T | None:
    """Run ``work``; if the client disconnects first, cancel it and return None."""
    task = asyncio.ensure_future(work)
    listener = asyncio.ensure_future(_wait_disconnect(request.receive))
    try:
        await asyncio.wait({task, listener}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        listener.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, APIError):
        await task
    return None


class DisconnectAwareStream(StreamingResponse):
    """An SSE response whose body iterator is cancelled (and closed) as soon as the client disconnects."""

    def __init__(self, content: Any, **kwargs: Any) -> None:
        kwargs.setdefault("media_type", "text/event-stream")
        headers = dict(kwargs.pop("headers", None) or {})
        headers.setdefault("Cache-Control", "no-cache")
        headers.setdefault("X-Accel-Buffering", "no")
        super().__init__(content, headers=headers, **kwargs)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as group:

            async def stream() -> None:
                with contextlib.suppress(OSError):  # the peer closed the socket mid-write
                    await self.stream_response(send)
                group.cancel_scope.cancel()

            async def listen() -> None:
                await _wait_disconnect(receive)
                group.cancel_scope.cancel()

            group.start_soon(stream)
            group.start_soon(listen)
        close = getattr(self.body_iterator, "aclose", None)
        if close is not None:
            await close()


class DrainGate:
    """ASGI middleware: while ``state.draining``, every new request (``/health`` included) is a 503 error object.

    Requests already past the gate run on. The listener stays open meanwhile (launch.py), so a client gets
    an answer it can act on instead of a refused connection, and a load balancer's probe sees the replica
    leave. ``Connection: close`` keeps a kept-alive client from sending its next request here.
    """

    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.state.draining:
            await self.app(scope, receive, send)
            return
        error = unavailable("the server is shutting down and takes no new requests")
        await JSONResponse(error.body(), status_code=error.status, headers={"Connection": "close"})(
            scope, receive, send
        )
