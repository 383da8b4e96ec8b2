"""pytest plugin of the conformance kit (entry point ``pytest11: dsa_runtime``).

``pytest --dsa-backend NAME [--dsa-full] [--dsa-device cpu|cuda] [--dsa-family F]`` run in any directory adds
one test item per conformance case, named by the case id (so ``-k sparse_attn/decode`` works). Cases the
backend does not claim are reported as skipped with the capability reason; when every selected case is
unclaimed the session fails (exit status 1), saying why: a pass with nothing run is not a pass. A vendor's
own tests collected in the same run are left alone.

pytest autoloads this module in every session of every environment where dsa-runtime is installed, so it
imports nothing heavy: without ``--dsa-backend`` its hooks return at once, and torch, the case tables and the
runner are imported only when the option is given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from dsa_runtime.testing.case import Case
    from dsa_runtime.testing.runner import RunContext

_CTX_KEY: pytest.StashKey[RunContext] = pytest.StashKey()
_NOTHING_KEY: pytest.StashKey[str] = pytest.StashKey()  # why the selected kit items certify nothing


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dsa-runtime", "dsa-runtime conformance kit")
    group.addoption(
        "--dsa-backend",
        metavar="NAME",
        default=None,
        help="run the dsa-runtime conformance kit against this backend (one test per case)",
    )
    group.addoption(
        "--dsa-full", action="store_true", default=False, help="include the full tier (real V3.2 shapes; GPU)"
    )
    group.addoption(
        "--dsa-device",
        metavar="DEVICE",
        default=None,
        choices=("cpu", "cuda"),
        help="device of the backend under test (default: cuda when claimed and available, else cpu)",
    )
    group.addoption(
        "--dsa-family",
        metavar="FAMILY",
        action="append",
        default=None,
        help="only this kernel family (repeatable)",
    )


class DSAConformanceFailure(Exception):
    """A case whose results differ from the reference; the message says what differed."""


class DSAConformanceCollector(pytest.Collector):
    """Parent node of the kit's items: ``dsa-conformance[NAME]``."""

    def collect(self) -> list[pytest.Item]:  # items are made in pytest_collection_modifyitems
        return []


class DSACaseItem(pytest.Item):
    """One conformance case; runs the backend and the reference and compares them."""

    def __init__(self, *, case: Case, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case

    def runtest(self) -> None:
        from dsa_runtime.testing.runner import run_case

        ctx = self.config.stash[_CTX_KEY]
        result = run_case(self.case, ctx)
        if result.status == "passed":
            return
        if result.status == "not_claimed":
            pytest.skip(result.message)
        if result.status == "error" and result.exception is not None:
            raise result.exception
        raise DSAConformanceFailure(result.message)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, DSAConformanceFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        # The family's case module is where the case is defined (skip/fail summaries need a line number).
        import importlib.util

        spec = importlib.util.find_spec(f"dsa_runtime.testing.cases_{self.case.family}")
        where = spec.origin if spec is not None and spec.origin else self.path
        return where, 0, f"dsa-conformance {self.case.id}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Append the kit's items *before* ``-k``/``-m`` deselection runs (hence ``tryfirst``)."""
    name = config.getoption("dsa_backend", None)
    if not name:
        return
    from dsa_runtime.errors import DSAError
    from dsa_runtime.testing.runner import prepare, select_cases

    try:
        ctx = prepare(name, device=config.getoption("dsa_device"))
        cases = select_cases(full=config.getoption("dsa_full"), families=config.getoption("dsa_family"))
    except DSAError as exc:
        raise pytest.UsageError(f"dsa-runtime conformance: {exc}") from None
    config.stash[_CTX_KEY] = ctx
    parent = DSAConformanceCollector.from_parent(
        session, name=f"dsa-conformance[{ctx.backend.name}]", nodeid=f"dsa-conformance[{ctx.backend.name}]"
    )
    made: list[pytest.Item] = []
    for case in cases:
        item = DSACaseItem.from_parent(parent, name=case.id, case=case)
        reason = ctx.unclaimed_reason(case)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"not claimed: {reason}"))
            item.unclaimed = reason  # type: ignore[attr-defined]
        made.append(item)
    # Report the collection like any collector does, so "collected N items", junitxml etc. count the kit.
    config.hook.pytest_collectreport(report=pytest.CollectReport(parent.nodeid, "passed", None, made))
    items.extend(made)


def pytest_collection_finish(session: pytest.Session) -> None:
    """After ``-k``/``-m`` deselection: note when kit items were selected but the backend claims none of them."""
    if _CTX_KEY not in session.config.stash:
        return
    from dsa_runtime.testing.report import CaseResult, nothing_claimed

    kit = [i for i in session.items if isinstance(i, DSACaseItem)]
    results = [CaseResult(i.case.id, i.case.family, "not_claimed" if hasattr(i, "unclaimed") else "passed",
                          getattr(i, "unclaimed", "")) for i in kit]
    reason = nothing_claimed(session.config.stash[_CTX_KEY].backend.name, results) if kit else None
    if reason is not None:
        session.config.stash[_NOTHING_KEY] = reason


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _NOTHING_KEY in session.config.stash and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if _NOTHING_KEY in config.stash:
        terminalreporter.write_line(f"dsa-runtime conformance FAILED: {config.stash[_NOTHING_KEY]}", red=True)


def pytest_report_header(config: pytest.Config) -> str | None:
    name = config.getoption("dsa_backend", None)
    if not name:
        return None
    tier = "full" if config.getoption("dsa_full") else "quick"
    return f"dsa-runtime conformance: backend {name}, {tier} tier"
