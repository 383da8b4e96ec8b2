"""Conformance results: a readable table and a JSON report (written atomically). No torch here."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATUSES = ("passed", "failed", "error", "crashed", "not_claimed")
_SUMMARY_KEYS = {
    "passed": "passed", "failed": "failed", "error": "errors", "crashed": "crashed", "not_claimed": "not_claimed",
}
_LABEL = {"passed": "pass", "failed": "FAIL", "error": "ERROR", "crashed": "CRASHED", "not_claimed": "not claimed"}
_CASE_KEYS = ("id", "family", "status", "message", "duration_s")


@dataclass
class CaseResult:
    """Outcome of one case.

    Attributes:
        status: ``passed``, ``failed`` (results differ; ``message`` says how), ``error`` (an exception:
            type and message; the run goes on), ``crashed`` (the process running the case died, e.g. a
            segfault, or the device context was lost, e.g. an illegal memory access; ``message`` names the
            signal or the CUDA error) or ``not_claimed`` (``message`` = the capability reason).
        method: the family method the case exercises (``sparse_attn.decode``).
        needs: the capability values the case asks for (``{"heads": 64, "k": 2048, ...}``).
        exception: the exception of an ``error`` (not serialized; the pytest plugin re-raises it).
    """

    id: str
    family: str
    status: str
    message: str = ""
    duration_s: float = 0.0
    exception: BaseException | None = field(default=None, repr=False, compare=False)
    method: str = ""
    needs: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "family": self.family,
            "method": self.method or method_of(self.family, self.id),
            "needs": {k: _jsonable(v) for k, v in self.needs.items()},
            "status": self.status,
            "message": self.message,
            "duration_s": round(self.duration_s, 4),
        }


def method_of(family: str, case_id: str) -> str:
    """``family.method`` from a case id (its second ``/`` segment): ``sparse_attn.decode``."""
    parts = case_id.split("/")
    return f"{family}.{parts[1]}" if len(parts) > 1 else family


def _jsonable(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (set, frozenset, tuple, list)):
        return sorted(_jsonable(x) for x in v) if isinstance(v, (set, frozenset)) else [_jsonable(x) for x in v]
    return str(v)


def _counts(results: Iterable[CaseResult]) -> dict[str, int]:
    counts = dict.fromkeys(_SUMMARY_KEYS.values(), 0)
    for r in results:
        counts[_SUMMARY_KEYS[r.status]] += 1
    return counts


def nothing_claimed(backend: str, cases: list[CaseResult]) -> str | None:
    """``"backend X claims no case of this selection: ..."`` when every case is ``not_claimed`` (or none was
    selected), else None. The reasons shown are the distinct ones, most frequent first."""
    if any(r.status != "not_claimed" for r in cases):
        return None
    head = f"backend {backend} claims no case of this selection"
    if not cases:
        return f"{head}: no case matched the selection (check --family / -k)"
    counts: dict[str, int] = {}
    for r in cases:
        counts[r.message] = counts.get(r.message, 0) + 1
    top = sorted(counts.items(), key=lambda kv: -kv[1])
    shown = "; ".join(f"{msg} ({n})" for msg, n in top[:3]) + ("; ..." if len(top) > 3 else "")
    return f"{head}: all {len(cases)} cases are not claimed: {shown}"


# Keys of ``Report.environment`` (flattened into the JSON's top level): who made the backend and what ran it.
ENVIRONMENT_KEYS = (
    "backend_package", "backend_package_version", "device_name", "platform", "python_version",
    "cuda_runtime_version", "cuda_driver_version",
)


@dataclass
class Report:
    """A conformance run: what ran where, and every case's result."""

    backend: str
    plugin: str
    version: str
    device: str
    torch_version: str
    full: bool
    started: str
    duration_s: float = 0.0
    oracle_device: str = ""
    cases: list[CaseResult] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    isolated: bool = False
    interrupted: bool = False
    not_run: int = 0

    @property
    def summary(self) -> dict[str, int]:
        """``{passed, failed, errors, crashed, not_claimed}`` counts."""
        return _counts(self.cases)

    @property
    def ok(self) -> bool:
        """True when nothing failed, raised or crashed, the run was complete, and at least one case ran
        (a pass with nothing run is no pass; not-claimed cases do not count against)."""
        s = self.summary
        return (
            s["failed"] == 0 and s["errors"] == 0 and s["crashed"] == 0 and not self.interrupted
            and self.nothing_claimed is None
        )

    @property
    def nothing_claimed(self) -> str | None:
        """Why the run certifies nothing (no selected case is claimed by the backend), or None when some ran."""
        return nothing_claimed(self.backend, self.cases)

    def by_family(self) -> dict[str, dict[str, int]]:
        """Per-family ``{passed, failed, errors, not_claimed}``, in the order families first appear."""
        fams: dict[str, list[CaseResult]] = {}
        for r in self.cases:
            fams.setdefault(r.family, []).append(r)
        return {f: _counts(rs) for f, rs in fams.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "plugin": self.plugin,
            "version": self.version,
            "device": self.device,
            "oracle_device": self.oracle_device,
            "torch_version": self.torch_version,
            **self.environment,
            "full": self.full,
            "started": self.started,
            "duration_s": round(self.duration_s, 3),
            "isolated": self.isolated,
            "interrupted": self.interrupted,
            "not_run": self.not_run,
            "summary": self.summary,
            "families": self.by_family(),
            "cases": [r.to_dict() for r in self.cases],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def write_json(self, path: str | os.PathLike[str]) -> Path:
        """Write the JSON report atomically: a temp file in the same folder, then ``os.replace``."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(self.to_json())
                fh.write("\n")
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        """Rebuild a report from :meth:`to_dict` output (e.g. to merge or re-render saved runs)."""
        fields = {k: d[k] for k in ("backend", "plugin", "version", "device", "torch_version", "full", "started")}
        cases = [
            CaseResult(**{k: c[k] for k in _CASE_KEYS}, method=c.get("method", ""), needs=c.get("needs", {}))
            for c in d["cases"]
        ]
        env = {k: d[k] for k in ENVIRONMENT_KEYS if k in d}
        return cls(
            **fields, duration_s=d.get("duration_s", 0.0), oracle_device=d.get("oracle_device", ""), cases=cases,
            environment=env, isolated=d.get("isolated", False), interrupted=d.get("interrupted", False),
            not_run=d.get("not_run", 0),
        )

    def format_table(self, *, show_passed: bool = True, width: int = 160) -> str:
        """Per-case table (status, time, id, message) followed by the per-family summary."""
        env = self.environment
        package = env.get("backend_package", "-")
        pkg = f", package {package} {env.get('backend_package_version', '-')}" if package != "-" else ""
        where = env.get("device_name", "")
        lines = [
            f"dsa-runtime conformance: backend {self.backend} (plugin {self.plugin or '-'}{pkg}), "
            f"dsa-runtime {self.version}, torch {self.torch_version}, device {self.device}"
            f"{f' ({where})' if where else ''}, {'full' if self.full else 'quick'} tier"
            f"{', isolated' if self.isolated else ''}",
            "",
            f"{'STATUS':<12} {'TIME':>8}  CASE",
        ]
        for r in self.cases:
            if r.status == "passed" and not show_passed:
                continue
            lines.append(f"{_LABEL[r.status]:<12} {r.duration_s:>7.2f}s  {r.id}")
            if r.message:  # a passed case's message says it ran through head/k padding
                msg = r.message if len(r.message) <= width else r.message[: width - 3] + "..."
                lines.append(f"{'':<12} {'':>8}    {msg}")
        lines += ["", f"{'FAMILY':<12} {'passed':>7} {'failed':>7} {'errors':>7} {'crashed':>8} {'not claimed':>12}"]
        for fam, c in [*self.by_family().items(), ("total", self.summary)]:
            lines.append(
                f"{fam:<12} {c['passed']:>7} {c['failed']:>7} {c['errors']:>7} {c['crashed']:>8} {c['not_claimed']:>12}"
            )
        verdict = "PASSED" if self.ok else "FAILED"
        if reason := self.nothing_claimed:
            lines += ["", reason]
        if self.interrupted:
            lines += ["", f"INTERRUPTED: {self.not_run} selected cases were not run"]
        lines += ["", f"{verdict} in {self.duration_s:.1f}s"]
        return "\n".join(lines)
