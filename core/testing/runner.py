"""Run the conformance kit against a backend, with the ``reference`` backend as the oracle.

Every selected case ends as exactly one of ``passed``, ``failed`` (message says what differed), ``error``
(an exception, recorded with its type and message; the run goes on), ``crashed`` (the process died or the
device context was lost; see :mod:`dsa_runtime.testing.isolate`) or ``not_claimed`` (the reason from the
backend's :class:`~dsa_runtime.capabilities.Capabilities`). Nothing is skipped silently.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import types
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import torch

import dsa_runtime
from dsa_runtime.backend import Backend
from dsa_runtime.capabilities import MethodClaim
from dsa_runtime.errors import ConfigError
from dsa_runtime.families import FAMILY_METHODS
from dsa_runtime.padding import PADDED_METHODS, PaddedSparseAttn, padded_needs, padding_note
from dsa_runtime.testing.case import Case, CheckContext, clone, move
from dsa_runtime.testing.progress import Progress
from dsa_runtime.testing.registry import all_cases
from dsa_runtime.testing.report import CaseResult, Report, method_of


def lookup_backend(name: str) -> Backend:
    """A registered backend by name (``ConfigError`` naming the valid ones when unknown)."""
    from dsa_runtime.plugin_manager import get_manager

    return get_manager().get_backend(name)


def resolve_backend(backend: str | Backend) -> Backend:
    """A Backend object as is; ``"module:callable"`` imported and called (a factory returning a Backend, or a
    Backend attribute); any other string looked up by name."""
    if isinstance(backend, Backend):
        return backend
    if ":" not in backend:
        return lookup_backend(backend)
    from dsa_runtime.backend import load_object

    try:
        made = load_object(backend)
        made = made if isinstance(made, Backend) else made()  # type: ignore[operator]
    except Exception as exc:
        raise ConfigError(f"backend factory {backend!r} failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(made, Backend):
        raise ConfigError(f"backend factory {backend!r} returned {type(made).__name__}, not a Backend")
    return made


@dataclass
class RunContext:
    """The backend under test, the oracle, and where each runs."""

    backend: Backend
    oracle: Backend
    device: torch.device
    oracle_device: torch.device

    def unclaimed_reason(self, case: Case) -> str | None:
        """Why the backend does not claim ``case`` on this device (even through padding), or None."""
        reason = self.backend.capabilities.unclaimed_reason(case.method, device=self.device.type, **case.needs)
        if reason is not None and self.padding(case):
            return None
        return reason

    def padding(self, case: Case) -> str:
        """``"pads heads 16 -> 64"`` when the case runs only through the caller's head/k padding, else ``""``.

        Such a case runs the backend through :class:`~dsa_runtime.padding.PaddedSparseAttn`, exactly as the
        engine calls it after resolution, so the padded path is what the kit certifies.
        """
        caps = self.backend.capabilities
        if case.method not in PADDED_METHODS:
            return ""
        needs = {"device": self.device.type, **case.needs}
        if caps.unclaimed_reason(case.method, **needs) is None:
            return ""
        claim = caps.claim(case.method)
        padded = padded_needs(case.method, claim, needs)
        if padded == needs or caps.unclaimed_reason(case.method, **padded) is not None:
            return ""
        return padding_note(case.method, claim, needs)


def _pick_device(backend: Backend, device: str | torch.device | None) -> torch.device:
    claims = backend.capabilities.devices
    cuda = torch.cuda.is_available()
    if device is None:
        if "cuda" in claims and cuda:
            return torch.device("cuda")
        if "cpu" in claims:
            return torch.device("cpu")
        raise ConfigError(
            f"backend {backend.name!r} claims devices {sorted(claims)}, none available here "
            f"(CUDA {'available' if cuda else 'not available'}; the kit runs on cpu or cuda); pass --device"
        )
    dev = torch.device(device)
    if dev.type == "cuda" and not cuda:
        raise ConfigError("device cuda requested but torch sees no CUDA device")
    return dev


def prepare(
    backend: str | Backend,
    *,
    device: str | torch.device | None = None,
    oracle_device: str | torch.device | None = None,
) -> RunContext:
    """Resolve the backend and the devices; raises ``ConfigError`` for an unknown/unavailable backend."""
    from dsa_runtime.reference.plugin import reference_backend

    b = resolve_backend(backend)
    ok, why = b.available()
    if not ok:
        raise ConfigError(f"backend {b.name!r} is not available here: {why}")
    dev = _pick_device(b, device)
    odev = torch.device(oracle_device) if oracle_device is not None else dev
    if odev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("oracle device cuda requested but torch sees no CUDA device")
    # Always a fresh built-in reference: never the object under test, even when it is called "reference".
    return RunContext(backend=b, oracle=reference_backend(), device=dev, oracle_device=odev)


def select_cases(
    *, full: bool = False, families: Iterable[str] | None = None, keyword: str | None = None
) -> list[Case]:
    """The cases of a run (see :func:`dsa_runtime.testing.registry.all_cases`)."""
    return all_cases(full=full, families=families, keyword=keyword)


@contextlib.contextmanager
def _exact_fp32() -> Iterator[None]:
    """The oracle computes in true fp32 whatever the caller set (no TF32 / reduced-precision matmuls)."""
    prev_prec = torch.get_float32_matmul_precision()
    prev_cudnn = torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(prev_prec)
        torch.backends.cudnn.allow_tf32 = prev_cudnn


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _device_alive(dev: torch.device) -> bool:
    """False when the device context is unusable (after a device-side assert every later call fails)."""
    if dev.type != "cuda":
        return True
    try:
        torch.cuda.synchronize(dev)
        return torch.ones(1, device=dev).item() == 1.0
    except Exception:
        return False


def run_case(case: Case, ctx: RunContext) -> CaseResult:
    """Run one case; never raises for a kernel's or a checker's exception (they become ``error``)."""
    start = time.perf_counter()
    head = f"family {case.family}, case {case.id}"

    def result(status: str, message: str = "", exc: BaseException | None = None) -> CaseResult:
        return CaseResult(
            case.id, case.family, status, message, time.perf_counter() - start, exc,
            method=getattr(case, "method", None) or method_of(case.family, case.id), needs=dict(case.needs),
        )

    reason = ctx.unclaimed_reason(case)
    if reason is not None:
        return result("not_claimed", reason)
    stage = "building the inputs"
    try:
        gen = torch.Generator(device=ctx.device).manual_seed(case.seed)
        inputs = case.build(gen, ctx.device)
        stage = "running the backend"
        kernel = ctx.backend.kernel(case.family)
        note = ctx.padding(case)
        if note:
            kernel = _padded_kernel(kernel, case.method, ctx.backend.capabilities.claim(case.method))
        got = case.run(kernel, clone(inputs))
        _sync(ctx.device)
        stage = "running the reference (oracle)"
        oracle = ctx.oracle.kernel(case.family)
        with _exact_fp32():
            want = move(case.run(oracle, move(clone(inputs), ctx.oracle_device)), ctx.device)
        stage = "checking the results"
        check = CheckContext(case, inputs, got, want, kernel, oracle, ctx.device, ctx.oracle_device)
        with _exact_fp32():
            message = case.check(check)
        _sync(ctx.device)
    except Exception as exc:  # a kernel bug must not end the run
        return result("error", f"{head}: {stage} raised {type(exc).__name__}: {exc}", exc)
    if message:
        return result("failed", f"{head}: {message}{f' (through padding: {note})' if note else ''}")
    return result("passed", f"through padding: {note}" if note else "")


def _padded_kernel(kernel: object, method: str, claim: MethodClaim | None) -> object:
    """A stand-in for the family's kernel object whose ``method`` pads heads / k (the others untouched)."""
    assert claim is not None
    family, name = method.split(".", 1)
    view = types.SimpleNamespace(**{m: getattr(kernel, m) for m in FAMILY_METHODS[family] if hasattr(kernel, m)})
    setattr(view, name, PaddedSparseAttn(getattr(kernel, name), method, claim))
    return view


def run_conformance(
    backend: str | Backend,
    *,
    full: bool = False,
    device: str | torch.device | None = None,
    families: Iterable[str] | None = None,
    oracle_device: str | torch.device | None = None,
    keyword: str | None = None,
    progress: bool | None = None,
    isolate: bool | None = None,
    json_path: str | os.PathLike[str] | None = None,
    case_timeout_s: float | None = None,
) -> Report:
    """Run the kit and return a :class:`Report`.

    Args:
        backend: a backend name (looked up through the plugin manager), a ``"module:callable"`` factory
            reference, or a :class:`Backend`.
        full: add the full tier (V3.2's real shapes; meant for a GPU).
        device: ``cpu``/``cuda``; default cuda when the backend claims it and CUDA is available, else cpu.
        families: only these kernel families.
        oracle_device: where the reference runs (default: the same device).
        keyword: only cases whose id contains this substring.
        progress: show progress on stderr (default: when stderr is a terminal).
        isolate: run the claimed cases in a worker process that is replaced after a crash (default: when the
            device is cuda); see :mod:`dsa_runtime.testing.isolate`.
        json_path: write the JSON report here after every case (atomically), so a killed run leaves its
            results so far; the final report is written at the end.
        case_timeout_s: with isolation, a case running longer is killed and reported ``crashed``.

    A ``KeyboardInterrupt`` ends the run early: the report comes back with ``interrupted`` set and the
    number of cases not run (and is written to ``json_path``); it is never ``ok``.
    """
    from dsa_runtime.testing import environment

    ctx = prepare(backend, device=device, oracle_device=oracle_device)
    cases = select_cases(full=full, families=families, keyword=keyword)
    isolated = ctx.device.type == "cuda" if isolate is None else isolate
    show = sys.stderr.isatty() if progress is None else progress
    report = Report(
        backend=ctx.backend.name,
        plugin=ctx.backend.plugin,
        version=dsa_runtime.__version__,
        device=str(ctx.device),
        oracle_device=str(ctx.oracle_device),
        torch_version=torch.__version__,
        full=full,
        started=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        environment=environment.collect(ctx.backend, ctx.device, name_device=not isolated),
        isolated=isolated,
    )
    t0 = time.perf_counter()
    bar = Progress(len(cases), show)
    worker = None
    if isolated:
        from dsa_runtime.testing.isolate import IsolatedRunner, backend_ref

        ref = backend_ref(backend if isinstance(backend, str) else ctx.backend, ctx.backend)
        worker = IsolatedRunner(ref, str(ctx.device), str(ctx.oracle_device), case_timeout_s)
    lost: str | None = None  # set once a kernel has broken the device context (e.g. a device-side assert)
    try:
        for case in cases:
            if worker is not None and ctx.unclaimed_reason(case) is None:
                res = worker.run(case)
                report.environment["device_name"] = worker.device_name or report.environment["device_name"]
            elif lost is not None and ctx.unclaimed_reason(case) is None:
                res = CaseResult(case.id, case.family, "error", f"family {case.family}, case {case.id}: not run: {lost}")
            else:
                res = run_case(case, ctx)
                if worker is None and res.status == "error" and not _device_alive(ctx.device):
                    lost = (
                        f"the {ctx.device.type} context was lost in case {case.id} "
                        f"({res.message.split(': ', 1)[-1].splitlines()[0][:160]}); "
                        "rerun the rest in a new process (-k, --family), or with --isolate"
                    )
            report.cases.append(res)
            bar.step(case, res)
            if json_path is not None:
                report.duration_s = time.perf_counter() - t0
                report.not_run = len(cases) - len(report.cases)
                report.write_json(json_path)
            if worker is None and ctx.device.type == "cuda" and case.tier == "full" and lost is None:
                with contextlib.suppress(Exception):
                    torch.cuda.empty_cache()
    except KeyboardInterrupt:
        report.interrupted = True
    finally:
        bar.close()
        if worker is not None:
            worker.close()
            if worker.device_name:
                report.environment["device_name"] = worker.device_name
            elif report.environment.get("device_name", "-") == "-":  # no worker ran: ask here, the run is over
                report.environment["device_name"] = environment.device_name(ctx.device)
    report.not_run = len(cases) - len(report.cases)
    report.duration_s = time.perf_counter() - t0
    if json_path is not None:
        report.write_json(json_path)
    return report


def summary_line(report: Report) -> str:
    s: dict[str, Any] = report.summary
    return (
        f"{s['passed']} passed, {s['failed']} failed, {s['errors']} errors, {s['crashed']} crashed, "
        f"{s['not_claimed']} not claimed"
    )
