"""Conformance kit: certify a backend plugin's kernels against the ``reference`` backend.

Three ways in, all running the same cases:

* ``dsa-runtime conformance NAME [--full] [--json PATH] [--device cpu|cuda] [--family F] [-k SUBSTRING]``;
* ``pytest --dsa-backend NAME`` in any directory (the ``pytest11`` plugin; one test per case);
* ``dsa_runtime.testing.run_conformance(NAME_or_Backend, ...) -> Report`` from Python.

The public names are imported lazily so that ``import dsa_runtime.testing`` (and pytest's autoload of the
plugin) does not import torch. See ``docs/conformance.md`` for the cases and the tolerance table.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dsa_runtime.testing.case import Case, CheckContext
    from dsa_runtime.testing.registry import all_cases
    from dsa_runtime.testing.report import CaseResult, Report
    from dsa_runtime.testing.runner import run_conformance
    from dsa_runtime.testing.tolerances import TOLERANCES, Tolerance

__all__ = [
    "TOLERANCES",
    "Case",
    "CaseResult",
    "CheckContext",
    "Report",
    "Tolerance",
    "all_cases",
    "run_conformance",
]

_LAZY = {
    "run_conformance": "dsa_runtime.testing.runner",
    "Report": "dsa_runtime.testing.report",
    "CaseResult": "dsa_runtime.testing.report",
    "Case": "dsa_runtime.testing.case",
    "CheckContext": "dsa_runtime.testing.case",
    "TOLERANCES": "dsa_runtime.testing.tolerances",
    "Tolerance": "dsa_runtime.testing.tolerances",
    "all_cases": "dsa_runtime.testing.registry",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dsa_runtime.testing' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
