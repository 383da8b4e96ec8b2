"""``dsa-runtime conformance``: table, JSON report, exit codes; the report's JSON and atomic write."""

from __future__ import annotations

import json
import os

import pytest

from dsa_runtime.cli.main import main
from dsa_runtime.hookspecs import hookimpl
from dsa_runtime.plugin_manager import get_manager
from dsa_runtime.testing import Report, all_cases
from dsa_runtime.testing.report import CaseResult
from tests.testing import wrong_backends as W

KEYS = {"backend", "plugin", "version", "device", "torch_version", "full", "started", "duration_s", "summary", "cases"}


def _register(*backends):
    @hookimpl
    def dsa_register_backends(register):
        for b in backends:
            register(b)

    plugin = type("KitTestPlugin", (), {"dsa_register_backends": staticmethod(dsa_register_backends)})()
    manager = get_manager()
    manager.add_plugin(plugin, "kit_test_plugin")
    manager.collect()


def test_cli_json_report_and_exit_0(tmp_path, capsys):
    path = tmp_path / "out" / "report.json"
    rc = main(["conformance", "reference", "--family", "topk", "--device", "cpu", "--json", str(path), "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    data = json.loads(path.read_text())
    assert set(data) >= KEYS
    n = len([c for c in all_cases() if c.family == "topk"])
    assert data["summary"] == {"passed": n, "failed": 0, "errors": 0, "crashed": 0, "not_claimed": 0}
    assert data["backend"] == "reference" and data["plugin"] == "reference" and data["device"] == "cpu"
    assert data["full"] is False and len(data["cases"]) == n
    assert set(data["cases"][0]) == {"id", "family", "method", "needs", "status", "message", "duration_s"}
    assert data["cases"][0]["method"] == "topk.topk" and data["cases"][0]["needs"] == {"k": 16}
    assert data["backend_package"] == "dsa-runtime" and data["device_name"] and data["isolated"] is False
    assert data["interrupted"] is False and data["not_run"] == 0
    assert "topk/topk/r8/l256/k16/full/randn" in out and "PASSED" in out
    assert [p.name for p in path.parent.iterdir()] == ["report.json"]  # no temp file left behind


def test_cli_exit_1_on_failure_and_k_filter(tmp_path, capsys):
    _register(W.make_backend("wrong_topk", {"topk": W.TopKIgnoresWindows}))
    path = tmp_path / "r.json"
    rc = main(["conformance", "wrong_topk", "-k", "topk/topk/", "--json", str(path), "--failures-only"])
    out = capsys.readouterr().out
    assert rc == 1
    data = json.loads(path.read_text())
    assert all(c["id"].startswith("topk/topk/") for c in data["cases"])
    assert data["summary"]["failed"] > 0 and data["plugin"] == "kit_test_plugin"
    assert "FAIL" in out and "family topk, case topk/topk/r16/l300/k32/ragged/randn" in out
    assert "pass " not in out  # --failures-only


def test_cli_unknown_backend_is_one_line_exit_2(capsys):
    rc = main(["conformance", "no_such_backend"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.startswith("dsa-runtime: error: unknown backend 'no_such_backend'") and "reference" in err
    assert len(err.splitlines()) == 1


def test_cli_rejects_unknown_family(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["conformance", "reference", "--family", "attention"])
    assert exc.value.code == 2


def test_cli_error_exit_1(capsys):
    _register(W.make_backend("raising", {"kv_quant": W.KVQuantRaises}, families=("kv_quant",)))
    assert main(["conformance", "raising", "-k", "gather_index_k"]) == 1
    assert "ERROR" in capsys.readouterr().out


def _report():
    return Report(
        backend="b", plugin="p", version="0.1.0", device="cpu", torch_version="2.x", full=False,
        started="2026-01-01T00:00:00+00:00", duration_s=1.5,
        cases=[
            CaseResult("topk/a", "topk", "passed", "", 0.1),
            CaseResult("topk/b", "topk", "failed", "family topk, case topk/b: slots differ", 0.2),
            CaseResult("moe/c", "moe", "error", "family moe, case moe/c: raised ValueError: x", 0.0, ValueError("x")),
            CaseResult("moe/d", "moe", "not_claimed", "family 'moe' not provided"),
            CaseResult("moe/route/e", "moe", "crashed", "family moe, case moe/route/e: died with signal SIGSEGV",
                       needs={"k": 8}),
        ],
        environment={"backend_package": "vendor-kernels", "backend_package_version": "1.2", "device_name": "X"},
    )


def test_report_summary_table_and_roundtrip(tmp_path):
    report = _report()
    assert report.summary == {"passed": 1, "failed": 1, "errors": 1, "crashed": 1, "not_claimed": 1}
    assert report.by_family() == {
        "topk": {"passed": 1, "failed": 1, "errors": 0, "crashed": 0, "not_claimed": 0},
        "moe": {"passed": 0, "failed": 0, "errors": 1, "crashed": 1, "not_claimed": 1},
    }
    assert not report.ok
    table = report.format_table()
    assert "FAIL" in table and "ERROR" in table and "not claimed" in table and "slots differ" in table
    assert "CRASHED" in table and "SIGSEGV" in table and "package vendor-kernels 1.2" in table
    path = report.write_json(tmp_path / "r.json")
    data = json.loads(path.read_text())
    assert data["backend_package"] == "vendor-kernels" and data["cases"][-1]["method"] == "moe.route"
    again = Report.from_dict(data)
    assert again.summary == report.summary and [c.id for c in again.cases] == [c.id for c in report.cases]
    assert again.environment == report.environment and again.cases[-1].needs == {"k": 8}


def test_report_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    path.write_text("previous")

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        _report().write_json(path)
    assert path.read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
