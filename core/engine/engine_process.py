"""The engine in its own process, so the HTTP server never competes with the step loop for the GIL.

:class:`EngineProcess` starts a child process (:mod:`dsa_runtime.processes`: CUDA initialises there only) that builds the
:class:`~dsa_runtime.engine.Engine` from an :class:`EngineConfig` and steps it whenever it has work, as SGLang's
scheduler process does. The parent holds a proxy with the Engine interface :class:`AsyncEngine` drives
(``add_request``, ``abort``, ``step``, ``has_unfinished``, ``stats``, plus ``tokenizer``, ``model_config``,
``max_model_len``, ``model_path`` and ``kernel_log``): commands go down a pipe, and :meth:`EngineProcess.step` returns
whatever outputs the child has sent since the last call, waiting briefly when there are none. The child runs
ahead on its own, so its step rate does not depend on how fast the server consumes the outputs.

Outputs travel as plain tuples of their deltas, without ``prompt_token_ids``, ``token_ids`` and ``text`` (which
grow with every step); the proxy puts them back from the prompt it sent and the deltas it has seen. The child sends from a thread of its
own, batching whatever queued up, so a step never waits for the server to read. A request the child refuses (a prompt too
long, a duplicate id) comes back as the exception ``add_request`` raised there, delivered to that request's
stream. The child ignores SIGINT/SIGTERM (the server drains through the parent) and exits when the pipe
closes, so it never outlives the server.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
import time
from typing import Any

from dsa_runtime.engine.outputs import RequestMetrics, RequestOutput
from dsa_runtime.processes import context, start

READY_TIMEOUT_S = 1800.0  # model load + kernel compiles + graph capture on a cold machine
IDLE_POLL_S = 0.05


class EngineProcessError(RuntimeError):
    """The engine process failed to start or died."""


def _child(conn: Any, config: Any, build: Any) -> None:
    """The engine process: build the engine (``build(config)``, by default :class:`Engine`), then apply commands
    and step, sending outputs as they come."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        if build is None:
            from dsa_runtime.engine import Engine as build

        engine = build(config)
        conn.send(("ready", {
            "tokenizer": engine.tokenizer, "model_config": engine.model_config,
            "max_model_len": engine.max_model_len, "model_path": engine.model_path,
            "kernel_log": engine.kernel_log, "stats": engine.stats(),
        }))
    except BaseException as exc:  # noqa: BLE001 - the parent must hear why, whatever it was
        with contextlib.suppress(Exception):
            conn.send(("fatal", f"{type(exc).__name__}: {exc}"))
        return
    outbox = _Outbox(conn)
    try:
        while True:
            if not engine.has_unfinished() and not conn.poll(IDLE_POLL_S):
                outbox.put(("stats", engine.stats()))
                continue
            while conn.poll():
                kind, payload = conn.recv()
                if kind == "stop":
                    return
                if kind == "add":
                    request_id, prompt, params = payload
                    try:
                        engine.add_request(request_id, prompt, params)
                    except Exception as exc:  # noqa: BLE001 - a bad request fails alone
                        outbox.put(("refused", (request_id, exc)))
                else:
                    with contextlib.suppress(KeyError, ValueError):
                        engine.abort(payload)
            if engine.has_unfinished():
                outbox.put(("out", ([_wire(out) for out in engine.step()], engine.stats())))
            if outbox.dead:
                return
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the server went away


def _wire(out: Any) -> tuple:
    """A step's output as plain values (a tenth of a dataclass's pickling time, paid on the step loop's GIL):
    its deltas, finish state and metric stamps; the proxy rebuilds the rest (:meth:`EngineProcess._restore`)."""
    m = out.metrics
    stamps = None if m is None else (m.arrival, m.scheduled, m.first_token, m.last_token, m.finished)
    return (out.request_id, out.new_token_ids, out.new_text, out.finished, out.finish_reason, out.stop_reason,
            out.logprobs or None, stamps, out.num_cached_tokens)


class _Outbox:
    """The child's sends, from a thread of their own: a step never waits for the server to read its last
    outputs (a full pipe would otherwise stall the step loop at the pace of the HTTP side)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.dead = False
        threading.Thread(target=self._run, name="dsa-engine-outbox", daemon=True).start()

    def put(self, message: tuple[str, Any]) -> None:
        self._queue.put(message)

    def _run(self) -> None:
        try:
            while True:
                batch = [self._queue.get()]
                while not self._queue.empty():  # everything queued meanwhile goes in one message
                    batch.append(self._queue.get())
                self._conn.send(("batch", batch))
        except (OSError, BrokenPipeError, ConnectionResetError):
            self.dead = True


class EngineProcess:
    """Proxy of an engine running in a child process (see the module docstring).

    Args:
        config: the :class:`~dsa_runtime.engine.EngineConfig` the child builds its engine from.
        ready_timeout_s: how long start-up (load, compiles, graph capture) may take.
        build: what the child builds its engine with, ``build(config)`` (a module-level callable, pickled to
            the child); by default :class:`~dsa_runtime.engine.Engine`. Benches pass an engine stand-in.
    """

    def __init__(self, config: Any, *, ready_timeout_s: float = READY_TIMEOUT_S, build: Any = None) -> None:
        ctx = context()
        self._conn, child_conn = ctx.Pipe()
        self._proc = start(_child, child_conn, config, build, ctx=ctx, name="dsa-engine")
        child_conn.close()
        deadline = time.monotonic() + ready_timeout_s
        while not self._conn.poll(1.0):
            if not self._proc.is_alive():
                raise EngineProcessError(f"the engine process exited during start-up (code {self._proc.exitcode})")
            if time.monotonic() > deadline:
                self.close()
                raise EngineProcessError(f"the engine process was not ready within {ready_timeout_s:.0f} s")
        kind, info = self._conn.recv()
        if kind != "ready":
            self.close()
            raise EngineProcessError(f"the engine process failed to start: {info}")
        self.tokenizer = info["tokenizer"]
        self.model_config = info["model_config"]
        self.max_model_len = info["max_model_len"]
        self.model_path: str | None = info["model_path"]
        self.kernel_log: tuple[str, ...] = info["kernel_log"]
        self._stats = info["stats"]
        self._live: dict[str, tuple[list[int], list[int], list[str]]] = {}  # id -> prompt, ids, text deltas

    # --- the Engine interface ------------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: Any) -> None:
        prompt = [int(t) for t in prompt_token_ids]
        if request_id in self._live:
            raise ValueError(f"request id {request_id!r} is already running")
        self._live[request_id] = (prompt, [], [])
        self._send(("add", (request_id, prompt, params)))

    def abort(self, request_id: str) -> None:
        if request_id in self._live:
            self._send(("abort", request_id))

    def has_unfinished(self) -> bool:
        return bool(self._live)

    def stats(self) -> Any:
        return self._stats

    def step(self, wait_s: float = IDLE_POLL_S) -> list[Any]:
        """The outputs the child sent since the last call, one per request (the deltas of several steps merged,
        as :meth:`RequestOutput.merged_with` does: a server that reads late restores and dispatches one output
        per request, not one per step), then refused requests as their exception, with ``request_id`` set;
        waits up to ``wait_s`` for the first message."""
        if not self._conn.poll(wait_s):
            self._check_alive()
            return []
        pending: dict[str, list[Any]] = {}  # request id -> its wire fields, deltas merged in arrival order
        refused: list[Any] = []
        while self._conn.poll():
            try:
                _, messages = self._conn.recv()
            except (EOFError, OSError) as exc:
                raise EngineProcessError(f"the engine process died (code {self._proc.exitcode})") from exc
            for kind, payload in messages:
                self._receive(kind, payload, pending, refused)
        outputs = [out for out in map(self._restore, pending.values()) if out is not None]
        return outputs + refused

    def _receive(self, kind: str, payload: Any, pending: dict[str, list[Any]], refused: list[Any]) -> None:
        """One message of the child's: a step's outputs (with its stats), stats alone, or a refused request."""
        if kind == "out":
            batch, self._stats = payload
            for wire in batch:
                merged = pending.get(wire[0])
                if merged is None:
                    pending[wire[0]] = list(wire)
                else:  # deltas joined; finish state, stamps and cached count are the later step's
                    merged[1] = merged[1] + wire[1]
                    merged[2] = merged[2] + wire[2]
                    merged[6] = (merged[6] or []) + (wire[6] or []) or None
                    merged[3:6], merged[7:] = wire[3:6], wire[7:]
        elif kind == "stats":
            self._stats = payload
        elif kind == "refused":
            request_id, exc = payload
            self._live.pop(request_id, None)
            exc.request_id = request_id
            refused.append(exc)

    def fileno(self) -> int:
        """The pipe the child's outputs arrive on: readable when :meth:`step` has something (or the child died),
        so an event loop can read them as they come (:class:`~dsa_runtime.engine.async_engine_process.AsyncEngineProcess`)."""
        return self._conn.fileno()

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the child (it finishes its current step first)."""
        with contextlib.suppress(OSError, BrokenPipeError):
            self._conn.send(("stop", None))
        self._proc.join(timeout_s)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5.0)
        with contextlib.suppress(OSError):
            self._conn.close()

    # --- helpers -------------------------------------------------------------------------------------------------
    def _restore(self, wire: list[Any]) -> Any:
        """The :class:`RequestOutput` of one :func:`_wire` tuple, totals rebuilt from the deltas seen so far."""
        request_id, new_ids, new_text, finished, reason, stop_reason, logprobs, stamps, cached = wire
        record = self._live.get(request_id)
        if record is None:
            return None  # a request this proxy no longer tracks
        prompt, tokens, text = record
        tokens.extend(new_ids)
        text.append(new_text)
        if finished:
            del self._live[request_id]
        return RequestOutput(
            request_id=request_id, prompt_token_ids=prompt, token_ids=list(tokens),
            text="".join(text),  # the engine's text is the concatenation of the deltas it released
            new_token_ids=new_ids, new_text=new_text, finished=finished, finish_reason=reason,
            stop_reason=stop_reason, logprobs=logprobs or [],
            metrics=None if stamps is None else RequestMetrics(*stamps), num_cached_tokens=cached,
        )

    def _send(self, message: tuple[str, Any]) -> None:
        try:
            self._conn.send(message)
        except (OSError, BrokenPipeError) as exc:
            raise EngineProcessError(f"the engine process died (code {self._proc.exitcode})") from exc

    def _check_alive(self) -> None:
        if not self._proc.is_alive():
            raise EngineProcessError(f"the engine process died (code {self._proc.exitcode})")
