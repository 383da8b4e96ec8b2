"""Conformance results: a readable table and a JSON report (written atomically). No torch here."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATUSES = ("passed", "failed", "error", "not_claimed")
_SUMMARY_KEYS = {"passed": "passed", "failed": "failed", "error": "errors", "not_claimed": "not_claimed"}
_LABEL = {"passed": "pass", "failed": "FAIL", "error": "ERROR", "not_claimed": "not claimed"}


@dataclass
class CaseResult:
    """Outcome of one case.

    Attributes:
        status: ``passed``, ``failed`` (results differ; ``message`` says how), ``error`` (an exception:
            type and message; the run goes on) or ``not_claimed`` (``message`` = the capability reason).
        exception: the exception of an ``error`` (not serialized; the pytest plugin re-raises it).
    """

    id: str
    family: str
    status: str
    message: str = ""
    duration_s: float = 0.0
    exception: BaseException | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "family": self.family,
            "status": self.status,
            "message": self.message,
            "duration_s": round(self.duration_s, 4),
        }


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

    @property
    def summary(self) -> dict[str, int]:
        """``{passed, failed, errors, not_claimed}`` counts."""
        return _counts(self.cases)

    @property
    def ok(self) -> bool:
        """True when nothing failed or raised and at least one case ran (a pass with nothing run is no pass)."""
        s = self.summary
        return s["failed"] == 0 and s["errors"] == 0 and self.nothing_claimed is None

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
            "full": self.full,
            "started": self.started,
            "duration_s": round(self.duration_s, 3),
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
        cases = [CaseResult(**{k: c[k] for k in ("id", "family", "status", "message", "duration_s")}) for c in d["cases"]]
        return cls(**fields, duration_s=d.get("duration_s", 0.0), oracle_device=d.get("oracle_device", ""), cases=cases)

    def format_table(self, *, show_passed: bool = True, width: int = 160) -> str:
        """Per-case table (status, time, id, message) followed by the per-family summary."""
        lines = [
            f"dsa-runtime conformance: backend {self.backend} (plugin {self.plugin or '-'}), dsa-runtime {self.version}, "
            f"torch {self.torch_version}, device {self.device}, {'full' if self.full else 'quick'} tier",
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
        lines += ["", f"{'FAMILY':<12} {'passed':>7} {'failed':>7} {'errors':>7} {'not claimed':>12}"]
        for fam, c in [*self.by_family().items(), ("total", self.summary)]:
            lines.append(f"{fam:<12} {c['passed']:>7} {c['failed']:>7} {c['errors']:>7} {c['not_claimed']:>12}")
        verdict = "PASSED" if self.ok else "FAILED"
        if reason := self.nothing_claimed:
            lines += ["", reason]
        lines += ["", f"{verdict} in {self.duration_s:.1f}s"]
        return "\n".join(lines)
