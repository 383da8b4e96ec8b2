"""``AsyncEngine``: the synchronous :class:`Engine` driven by one background thread, for asyncio callers.

The engine is not thread-safe, so every call into it (``add_request``, ``abort``, ``step``, ``stats``)
happens on the one loop thread. asyncio callers hand it commands through a locked queue and receive
:class:`RequestOutput` objects on per-request ``asyncio.Queue`` objects, fed with
``loop.call_soon_threadsafe`` once per engine step (outputs that queued while a consumer was busy reach it
merged into one, so a slow HTTP side sends fewer, larger chunks rather than falling behind)::

    engine = AsyncEngine(Engine.from_model(None))
    engine.start()
    async for out in engine.generate(prompt_token_ids, SamplingParams(max_tokens=16), "req-1"):
        print(out.new_text, end="")
    await engine.shutdown(drain_timeout=5.0)

A consumer that stops iterating (a client that went away) aborts its request, which frees its pages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

logger = logging.getLogger(__name__)


class EngineLike(Protocol):
    """``dsa_runtime.engine.Engine``'s interface as the server sees it (docs/server.md, "The engine interface")."""

    tokenizer: Any
    max_model_len: int
    model_config: Any  # None when unknown
    model_path: str | None  # the checkpoint folder, None when there is none
    kernel_log: tuple[str, ...]  # start-up lines: the resolved platform and each kernel's backend

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: Any) -> None: ...
    def step(self) -> list[Any]: ...
    def abort(self, request_id: str) -> None: ...
    def has_unfinished(self) -> bool: ...
    def stats(self) -> Any: ...
    def close(self) -> None: ...


class EngineDeadError(RuntimeError):
    """The engine loop stopped after an error; every request fails with this until restart."""


class EngineShuttingDown(RuntimeError):
    """The engine is draining for shutdown and takes no new requests."""


@dataclass
class _Stream:
    queue: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    finished: bool = False


class AsyncEngine:
    """Wraps a synchronous engine in one background stepping thread (see the module docstring).

    Args:
        engine: an object with the Engine interface (:class:`EngineLike`), reachable as :attr:`engine`.
        idle_wait_s: how long the loop sleeps when there is nothing to do and no command arrives.
    """

    def __init__(self, engine: EngineLike, *, idle_wait_s: float = 0.05) -> None:
        self.engine = engine
        self._idle_wait_s = idle_wait_s
        self._commands: list[tuple[str, Any]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._thread: threading.Thread | None = None
        self._stop = False
        self._accepting = True
        self._error: BaseException | None = None
        self._stats: Any = None
        self.steps = 0
        self.last_step_s = 0.0

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the stepping thread (idempotent)."""
        if self._thread is not None:
            return
        self._stats = self.engine.stats()
        self._thread = threading.Thread(target=self._run, name="dsa-engine-loop", daemon=True)
        self._thread.start()

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._error is None

    @property
    def error(self) -> BaseException | None:
        return self._error

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    async def shutdown(self, drain_timeout: float = 5.0) -> None:
        """Stop taking requests, let running ones finish for ``drain_timeout`` seconds, abort the rest, stop."""
        self._accepting = False
        deadline = time.monotonic() + max(0.0, drain_timeout)
        while self._streams and time.monotonic() < deadline and self.is_running:
            await asyncio.sleep(0.02)
        for request_id in list(self._streams):
            self._submit("abort", request_id)
        # Aborted streams get their final "abort" output within a step; give them a moment to see it.
        deadline = time.monotonic() + 2.0
        while self._streams and time.monotonic() < deadline and self.is_running:
            await asyncio.sleep(0.02)
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 10.0)
        await self._close_engine()

    async def _close_engine(self) -> None:
        # The engine's process or its workers stop with the server (off the loop: it may wait on them).
        await asyncio.get_running_loop().run_in_executor(None, self.engine.close)

    # -- requests ------------------------------------------------------------------------------------
    async def generate(self, prompt_token_ids: list[int], params: Any, request_id: str) -> AsyncIterator[Any]:
        """Yield the request's :class:`RequestOutput` objects until one is ``finished``.

        Raises whatever the engine's ``add_request`` raised (e.g. ValueError for a prompt longer than the
        context), :class:`EngineShuttingDown` during shutdown, :class:`EngineDeadError` after a loop error.
        Leaving the loop early (break, cancellation) aborts the request.
        """
        self._check_accepting()
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        stream = _Stream(asyncio.Queue(), asyncio.get_running_loop())
        self._streams[request_id] = stream
        self._submit("add", (request_id, list(prompt_token_ids), params))
        try:
            while True:
                item = await stream.queue.get()
                # Outputs that queued up while the consumer was busy go out as one (their deltas joined):
                # under load the HTTP side then does one chunk's work per wake-up, not one per engine step.
                while not stream.queue.empty() and not isinstance(item, BaseException) and not item.finished:
                    nxt = stream.queue.get_nowait()
                    item = nxt if isinstance(nxt, BaseException) else item.merged_with(nxt)
                if isinstance(item, BaseException):
                    stream.finished = True
                    raise item
                if item.finished:
                    stream.finished = True
                yield item
                if stream.finished:
                    return
        finally:
            if not stream.finished:
                self._submit("abort", request_id)
            self._streams.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        """Abort a request; its stream ends with a ``finish_reason="abort"`` output."""
        self._submit("abort", request_id)

    def stats(self) -> Any:
        """The engine's stats as of the last step (read on the loop thread, so never torn)."""
        return self._stats

    # -- loop thread ---------------------------------------------------------------------------------
    def _check_accepting(self) -> None:
        if self._error is not None:
            raise EngineDeadError(f"engine stopped after an error: {self._error}")
        if not self._accepting:
            raise EngineShuttingDown("server is shutting down")
        if self._thread is None:
            raise RuntimeError("AsyncEngine.start() was not called")

    def _submit(self, kind: str, payload: Any) -> None:
        with self._lock:
            self._commands.append((kind, payload))
        self._wake.set()

    def _run(self) -> None:
        try:
            while not self._stop:
                self._turn()
        except BaseException as exc:  # noqa: BLE001 - every waiting request must hear about it
            logger.exception("engine loop failed")
            self._fail(exc)

    def _turn(self) -> None:
        """One pass of the loop thread: apply the queued commands, then step (or wait for work)."""
        self._apply_commands()
        if self.engine.has_unfinished():
            start = time.perf_counter()
            outputs = self.engine.step()
            self.last_step_s = time.perf_counter() - start
            self.steps += 1
            self._stats = self.engine.stats()
            if outputs:
                self._dispatch(outputs)
        else:
            self._stats = self.engine.stats()
            self._wake.wait(self._idle_wait_s)
            self._wake.clear()

    def _fail(self, exc: BaseException) -> None:
        """The engine is dead: remember why, and fail every open stream with :class:`EngineDeadError`."""
        self._error = exc
        dead = EngineDeadError(f"engine stopped after an error: {type(exc).__name__}: {exc}")
        for stream in list(self._streams.values()):
            self._deliver(stream, dead)

    def _apply_commands(self) -> None:
        with self._lock:
            commands, self._commands = self._commands, []
        for kind, payload in commands:
            if kind == "add":
                request_id, prompt, params = payload
                stream = self._streams.get(request_id)
                if stream is None:
                    continue  # the caller gave up before the request reached the engine
                try:
                    self.engine.add_request(request_id, prompt, params)
                except Exception as exc:  # noqa: BLE001 - a bad request fails alone, the loop goes on
                    self._deliver(stream, exc)
            else:
                with contextlib.suppress(KeyError, ValueError):  # already finished: nothing to free
                    self.engine.abort(payload)

    def _dispatch(self, outputs: list[Any]) -> None:
        """Outputs to their streams; an engine process reports a refused request as its exception, with the
        ``request_id`` set, which its stream raises."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, Any]]] = {}
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is not None:
                by_loop.setdefault(stream.loop, []).append((stream, out))
        for loop, items in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that event loop is closed: its consumers are gone
                loop.call_soon_threadsafe(_put_all, items)

    def _deliver(self, stream: _Stream, item: Any) -> None:
        with contextlib.suppress(RuntimeError):
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)


def _put_all(items: list[tuple[_Stream, Any]]) -> None:
    for stream, out in items:
        stream.queue.put_nowait(out)
