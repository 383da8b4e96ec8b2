"""``AsyncEngineProcess``: :class:`AsyncEngine` over an :class:`EngineProcess`, its outputs read on the event loop.

An engine in its own process needs no stepping thread on the server's side: the child steps by itself and
its outputs arrive on a pipe. Here the asyncio event loop watches that pipe (``loop.add_reader``) and hands
each read's outputs (one per request, however many steps it covers: ``EngineProcess.step``) straight to the
request queues. So the server process runs one Python thread per token instead of two: no second thread
waking per engine step to unpickle the outputs, no hand-off through ``call_soon_threadsafe``, and no fight for
the GIL with the thread that writes the streams (which cost latency in multiples of the interpreter's 5 ms
switch interval). Commands (add, abort) still go down the pipe from a thread, so a long prompt's write never
blocks the event loop while the child is busy with a step.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from dsa_runtime.engine.async_engine import AsyncEngine
from dsa_runtime.engine.engine_process import EngineProcess

logger = logging.getLogger(__name__)


class AsyncEngineProcess(AsyncEngine):
    """:class:`AsyncEngine` for an :class:`EngineProcess` (see the module docstring); same interface.

    The pipe is watched from the first :meth:`start` or :meth:`generate` made on a running event loop.
    """

    def __init__(self, engine: EngineProcess, *, idle_wait_s: float = 0.05) -> None:
        super().__init__(engine, idle_wait_s=idle_wait_s)
        self._reader: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        super().start()  # the command thread
        self._watch()

    def _check_accepting(self) -> None:
        super()._check_accepting()
        self._watch()

    def _watch(self) -> None:
        """Read the pipe on the running event loop (once; no loop running: later, from ``generate``)."""
        if self._reader is not None or self._error is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        fd = self.engine.fileno()
        loop.add_reader(fd, self._on_readable)
        # uvloop (libuv) makes a watched descriptor non-blocking; the pipe's reads and writes must stay whole
        # messages (a read starts only once one is arriving, and the child writes each at once).
        os.set_blocking(fd, True)
        self._reader = loop

    def _unwatch(self) -> None:
        if self._reader is not None:
            self._reader.remove_reader(self.engine.fileno())
            self._reader = None

    def _on_readable(self) -> None:
        """Runs on the event loop when the child has sent something: route every output to its stream."""
        try:
            outputs = self.engine.step(wait_s=0.0)  # never waits on the event loop
        except Exception as exc:  # noqa: BLE001 - the child died: every open request must hear about it
            logger.error("engine process failed: %s", exc)
            self._unwatch()
            self._fail(exc)
            return
        self.steps += 1
        self._stats = self.engine.stats()
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is not None:
                stream.queue.put_nowait(out)

    def _turn(self) -> None:
        """The command thread's pass: send what was submitted (the child steps by itself)."""
        self._wake.wait(self._idle_wait_s)
        self._wake.clear()
        self._apply_commands()

    async def _close_engine(self) -> None:
        self._unwatch()
        await super()._close_engine()


def async_engine_for(engine: Any) -> AsyncEngine:
    """The asyncio front of an engine: itself if it is one, :class:`AsyncEngineProcess` for an engine process,
    else :class:`AsyncEngine` (a stepping thread)."""
    if isinstance(engine, AsyncEngine):
        return engine
    if isinstance(engine, EngineProcess):
        return AsyncEngineProcess(engine)
    return AsyncEngine(engine)
