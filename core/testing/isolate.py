"""Crash isolation: run cases in a child process that is replaced after a crash.

A kernel that segfaults, hits an illegal memory access or trips a device-side assert kills (or poisons) the
process it runs in. With isolation the parent process only schedules: each claimed case is sent by id to a
worker process (started as :mod:`dsa_runtime.processes` starts children, so no CUDA state is inherited), which runs it exactly as
:func:`~dsa_runtime.testing.runner.run_case` does and sends the :class:`CaseResult` back. When the worker
dies, the case is ``crashed`` with the signal (``SIGSEGV``) or exit code; when a case leaves the device
context unusable, the worker reports the case ``crashed`` with the CUDA error and exits. Either way the next
case starts a fresh worker, and the run goes on.

The worker must find the same backend. :func:`backend_ref` describes it as one of

* ``("name", NAME)``: a registered backend, looked up through the plugin manager in the worker;
* ``("factory", "module:callable")``: an importable zero-argument callable returning a :class:`Backend`
  (e.g. a backend defined in a vendor's test module); a ``"module:callable"`` string works wherever a
  backend name does (``dsa-runtime conformance tests.my_backends:make``);
* ``("pickle", bytes)``: a :class:`Backend` object whose kernel factories are importable (strings or
  module-level classes) and which is therefore sent by value.
"""

from __future__ import annotations

import contextlib
import pickle
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dsa_runtime.errors import ConfigError
from dsa_runtime.processes import context, start

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from dsa_runtime.backend import Backend
    from dsa_runtime.testing.case import Case
    from dsa_runtime.testing.report import CaseResult

_POLL_S = 0.05


@dataclass(frozen=True)
class BackendRef:
    """How a worker process finds the backend under test (see the module docstring)."""

    kind: str  # "name" | "factory" | "pickle"
    value: Any


def backend_ref(backend: str | Backend, resolved: Backend | None = None) -> BackendRef:
    """Describe ``backend`` for a worker; ``ConfigError`` when a Backend object cannot be sent.

    A name whose ``resolved`` Backend pickles is sent by value (so a backend registered in-process, which a
    fresh process's plugin manager cannot find, still works); otherwise by name.
    """
    if isinstance(backend, str):
        if ":" in backend:
            return BackendRef("factory", backend)
        if resolved is not None:
            with contextlib.suppress(ConfigError):
                return backend_ref(resolved)
        return BackendRef("name", backend)
    from dataclasses import fields

    state = {f.name: getattr(backend, f.name) for f in fields(backend) if f.init}
    try:
        pickle.dumps(state["available"])
    except Exception:  # the default is a lambda; the parent has already checked availability
        state.pop("available")
    try:
        return BackendRef("pickle", pickle.dumps(state))
    except Exception as exc:
        raise ConfigError(
            f"backend {backend.name!r} cannot be sent to the isolated worker process ({type(exc).__name__}: {exc}); "
            "register it through a plugin, pass an importable 'module:callable' factory, or run without isolation "
            "(--no-isolate)"
        ) from None


def load_backend_ref(ref: BackendRef) -> Backend | str:
    """The backend a :class:`BackendRef` names (a name is returned as is, for ``prepare`` to look up)."""
    if ref.kind == "name":
        return str(ref.value)
    if ref.kind == "factory":
        from dsa_runtime.testing.runner import resolve_backend

        return resolve_backend(str(ref.value))
    from dsa_runtime.backend import Backend

    return Backend(**pickle.loads(ref.value))


def _worker(conn: Connection, ref: BackendRef, device: str, oracle_device: str) -> None:
    """Worker main loop: receive case ids, send results; exit after a lost device context."""
    try:
        from dsa_runtime.testing import runner
        from dsa_runtime.testing.registry import all_cases
        from dsa_runtime.testing.runner import prepare, run_case

        ctx = prepare(load_backend_ref(ref), device=device, oracle_device=oracle_device)
        cases = {c.id: c for c in all_cases(full=True)}
    except BaseException as exc:
        conn.send(("fatal", f"{type(exc).__name__}: {exc}"))
        return
    from dsa_runtime.testing.environment import device_name

    conn.send(("ready", device_name(ctx.device)))
    while True:
        try:
            case_id = conn.recv()
        except EOFError:
            return
        if case_id is None:
            return
        res = run_case(cases[case_id], ctx)
        lost = res.status == "error" and not runner._device_alive(ctx.device)
        if lost:
            res.status = "crashed"
            res.message = f"{res.message} (the {ctx.device.type} context is lost; later cases run in a fresh process)"
        res.exception = None  # exceptions need not pickle; the message carries type and text
        conn.send(("result", res))
        if lost:
            return


def describe_exit(exitcode: int | None) -> str:
    """``signal SIGSEGV`` for a negative exit code, ``exit code 3`` otherwise."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


class IsolatedRunner:
    """Runs cases in a worker process, replacing it after each crash. Use as a context manager."""

    def __init__(self, ref: BackendRef, device: str, oracle_device: str, case_timeout_s: float | None = None):
        self.ref, self.device, self.oracle_device = ref, device, oracle_device
        self.case_timeout_s = case_timeout_s
        self.proc: Any = None
        self.conn: Connection | None = None
        self.started = 0  # worker processes started (the first one plus one per crash)
        self.device_name = ""  # as the worker sees it (the parent never initializes CUDA itself)

    def __enter__(self) -> IsolatedRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        ctx = context()
        parent, child = ctx.Pipe()
        self.proc = start(_worker, child, self.ref, self.device, self.oracle_device, ctx=ctx,
                          name="dsa-conformance-worker")
        child.close()
        self.conn = parent
        self.started += 1
        kind, payload = self._receive(None)
        if kind == "fatal":
            self.close()
            raise ConfigError(f"the isolated worker process could not set up the backend: {payload}")
        if kind != "ready":
            self.close()
            raise ConfigError(f"the isolated worker process died while starting ({payload})")
        self.device_name = str(payload)

    def _receive(self, timeout_s: float | None) -> tuple[str, Any]:
        """The worker's next message, ``("died", why)`` when it exits first, ``("timeout", s)`` after ``timeout_s``."""
        assert self.conn is not None and self.proc is not None
        t0 = time.monotonic()
        while True:
            try:
                if self.conn.poll(_POLL_S):
                    return self.conn.recv()
            except (EOFError, OSError):
                self.proc.join(5)
                return "died", describe_exit(self.proc.exitcode)
            if not self.proc.is_alive():
                if self.conn.poll(0):  # sent its last message just before exiting
                    continue
                return "died", describe_exit(self.proc.exitcode)
            if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                return "timeout", timeout_s

    def run(self, case: Case) -> CaseResult:
        """Run one (claimed) case in the worker; a worker that dies or times out makes the case ``crashed``."""
        from dsa_runtime.testing.report import CaseResult

        start = time.perf_counter()
        head = f"family {case.family}, case {case.id}"
        if self.proc is None or not self.proc.is_alive():
            self.close()
            try:
                self._start()
            except ConfigError as exc:
                if self.started <= 1:  # the very first worker failed: nothing can run, say so once
                    raise
                # A restart after a crash failed (e.g. the device is gone): this case is lost, the next tries again.
                return CaseResult(
                    case.id, case.family, "crashed", f"{head}: not run: {exc}", time.perf_counter() - start,
                    method=_method(case), needs=dict(case.needs),
                )
        assert self.conn is not None
        try:
            self.conn.send(case.id)
            kind, payload = self._receive(self.case_timeout_s)
        except (BrokenPipeError, OSError):
            kind, payload = "died", describe_exit(self.proc.exitcode)
        if kind == "result":
            if payload.status == "crashed":  # the worker exits after a lost context: wait for it, start anew
                self.close()
            return payload
        if kind == "timeout":
            why = f"timed out after {payload:g} s (the worker was killed)"
        else:
            why = f"the worker process died with {payload}"
        self.close()
        return CaseResult(
            case.id, case.family, "crashed", f"{head}: {why} while running the case; later cases run in a fresh process",
            time.perf_counter() - start, method=_method(case), needs=dict(case.needs),
        )

    def close(self) -> None:
        """Stop the worker (politely, then by force); safe to call twice."""
        if self.conn is not None:
            with contextlib.suppress(BrokenPipeError, OSError):
                self.conn.send(None)
            self.conn.close()
            self.conn = None
        if self.proc is not None:
            self.proc.join(2)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(5)
            self.proc = None


def _method(case: Case) -> str:
    from dsa_runtime.testing.report import method_of

    return getattr(case, "method", None) or method_of(case.family, case.id)
