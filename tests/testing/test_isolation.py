"""Crash isolation: a segfault or a lost device context marks one case crashed and the run goes on."""

from __future__ import annotations

import json

import pytest

from dsa_runtime.cli.main import main
from dsa_runtime.errors import ConfigError
from dsa_runtime.testing import run_conformance
from dsa_runtime.testing.isolate import IsolatedRunner, backend_ref, describe_exit
from dsa_runtime.testing.registry import all_cases
from tests.testing import crashing_backends as C
from tests.testing import wrong_backends as W

SEGV_CASE = "topk/topk/r8/l256/k1/ragged/randn"
RAISE_CASES = {"topk/topk/r10/l256/k20/ragged/ties", "topk/topk/r8/l256/k20/full/ties"}


def test_segfault_and_raise_with_isolate_every_other_case_runs(tmp_path, capsys):
    path = tmp_path / "r.json"
    rc = main([
        "conformance", "tests.testing.crashing_backends:make_crashing", "--family", "topk", "-k", "topk/topk/",
        "--isolate", "--device", "cpu", "--json", str(path), "--no-progress",
    ])
    out = capsys.readouterr().out
    assert rc == 1
    data = json.loads(path.read_text())
    cases = {c["id"]: c for c in data["cases"]}
    assert set(cases) == {c.id for c in all_cases(families=["topk"], keyword="topk/topk/")}  # complete
    assert cases[SEGV_CASE]["status"] == "crashed" and "signal SIGSEGV" in cases[SEGV_CASE]["message"]
    for cid in RAISE_CASES:
        assert cases[cid]["status"] == "error" and "illegal memory access" in cases[cid]["message"]
    others = [c for cid, c in cases.items() if cid not in RAISE_CASES | {SEGV_CASE}]
    assert others and all(c["status"] == "passed" for c in others)  # the run went on after the crash
    assert data["summary"]["crashed"] == 1 and data["isolated"] is True and data["not_run"] == 0
    assert data["device_name"] not in ("", "-") and data["backend_package"] == "-"  # a factory: no package
    assert "CRASHED" in out and "FAILED" in out


def test_lost_context_in_worker_is_crashed_and_worker_replaced():
    """A worker whose device is unusable after an error reports the case crashed and exits; the next case
    gets a fresh worker."""
    report = run_conformance("tests.testing.crashing_backends:make_losing_context", families=["topk"],
                             keyword="topk/topk/", device="cpu", progress=False, isolate=True)
    st = {c.id: c for c in report.cases}
    for cid in RAISE_CASES:  # the second one ran in a fresh worker and lost it again
        assert st[cid].status == "crashed" and "device-side assert" in st[cid].message, st[cid].message
        assert "context is lost" in st[cid].message
    assert all(c.status == "passed" for cid, c in st.items() if cid not in RAISE_CASES)


def test_killed_worker_is_replaced():
    backend = W.make_backend("raising", {"kv_quant": W.KVQuantRaises}, families=("kv_quant",))
    runner = IsolatedRunner(backend_ref(backend), "cpu", "cpu")
    cases = {c.id: c for c in all_cases(families=["kv_quant"])}
    with runner:
        ok = runner.run(cases["kv_quant/store_index_k/p64/n30"])
        bad = runner.run(cases["kv_quant/gather_index_k/p64/n30"])  # raises: error, the cpu "context" is fine
        assert runner.started == 1
        runner.proc.kill()  # as if the device had taken the process down between cases
        runner.proc.join()
        again = runner.run(cases["kv_quant/store_index_k/p16/n30"])
        assert runner.started == 2
    assert ok.status == "passed" and again.status == "passed" and ok.method == "kv_quant.store_index_k"
    assert bad.status == "error" and "not compiled" in bad.message


def test_case_timeout_kills_the_worker():
    import time

    runner = IsolatedRunner(backend_ref("tests.testing.crashing_backends:make_hanging"), "cpu", "cpu", 1.0)
    case = next(c for c in all_cases(families=["topk"]) if c.id == "topk/topk/r8/l256/k16/full/randn")
    t0 = time.monotonic()
    with runner:
        res = runner.run(case)
    assert res.status == "crashed" and "timed out after 1 s" in res.message and time.monotonic() - t0 < 60


def test_unsendable_backend_is_a_config_error():
    backend = W.make_backend("lambda_kernels", {"topk": W.TopKIgnoresWindows}, families=("topk",))
    backend.kernels = {"topk": lambda: W.TopKIgnoresWindows()}
    with pytest.raises(ConfigError, match="--no-isolate"):
        backend_ref(backend)


def test_describe_exit():
    assert describe_exit(-11) == "signal SIGSEGV" and describe_exit(-6) == "signal SIGABRT"
    assert describe_exit(3) == "exit code 3"


def test_keyboard_interrupt_writes_partial_report(tmp_path, capsys):
    path = tmp_path / "r.json"
    backend = W.make_backend("interrupted", {"topk": C.TopKInterrupted}, families=("topk",))
    report = run_conformance(backend, families=["topk"], keyword="topk/topk/", device="cpu", progress=False,
                             isolate=False, json_path=path)
    data = json.loads(path.read_text())
    assert report.interrupted and not report.ok and report.not_run > 0
    assert data["interrupted"] is True and data["not_run"] == report.not_run
    assert len(data["cases"]) == len(report.cases) > 0 and all(c["status"] == "passed" for c in data["cases"])


def test_backend_registered_in_process_reaches_the_worker():
    """A backend registered through add_plugin (invisible to a fresh process's plugin manager) is sent by value."""
    from tests.testing.test_cli_and_report import _register

    _register(W.make_backend("inproc_wrong_topk", {"topk": W.TopKPadsWithZero}, families=("topk",)))
    assert backend_ref("inproc_wrong_topk", W.make_backend("x", {}, families=("topk",))).kind == "pickle"
    report = run_conformance("inproc_wrong_topk", keyword="topk/topk/r12/l100", device="cpu", progress=False,
                             isolate=True)
    assert report.isolated and [c.status for c in report.cases] == ["failed"]


def test_worker_that_cannot_set_up_the_backend_is_a_config_error():
    with pytest.raises(ConfigError, match="could not set up the backend: .*libvendor.so"):
        run_conformance("tests.testing.crashing_backends:make_fails_in_worker", families=["topk"], keyword="k16/",
                        device="cpu", progress=False, isolate=True)
