"""The pytest11 plugin: ``pytest --dsa-backend NAME`` in any directory runs the kit, one item per case."""

from __future__ import annotations

import os
import subprocess
import sys

from dsa_runtime.hookspecs import hookimpl
from dsa_runtime.plugin_manager import get_manager
from dsa_runtime.testing import all_cases
from tests.testing import wrong_backends as W

pytest_plugins = ["pytester"]

N_TOPK = len([c for c in all_cases() if c.family == "topk"])


def _register(*backends):
    @hookimpl
    def dsa_register_backends(register):
        for b in backends:
            register(b)

    manager = get_manager()
    manager.add_plugin(type("P", (), {"dsa_register_backends": staticmethod(dsa_register_backends)})(), "pytest_kit_plugin")
    manager.collect()


def test_k_selects_cases_by_id(pytester):
    result = pytester.runpytest("--dsa-backend", "reference", "-k", "topk", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=N_TOPK, deselected=len(all_cases()) - N_TOPK)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*dsa-runtime conformance: backend reference, quick tier*"])


def test_collect_only_lists_case_ids(pytester):
    result = pytester.runpytest("--dsa-backend", "reference", "--dsa-family", "kv_quant", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["dsa-conformance[[]reference[]]::kv_quant/store_mla/fp8_656/ue8m0/p16/n30"])


def test_without_option_the_plugin_adds_nothing(pytester):
    pytester.makepyfile("def test_own(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "dsa-conformance" not in result.stdout.str()


def test_vendor_tests_and_kit_run_together(pytester):
    pytester.makepyfile("def test_vendor_own(): pass")
    result = pytester.runpytest("--dsa-backend", "reference", "-k", "page_table_transform or vendor_own")
    result.assert_outcomes(passed=4)


def test_failures_and_unclaimed_cases(pytester):
    _register(
        W.make_backend("pytest_wrong_topk", {"topk": W.TopKIgnoresWindows}),
        W.make_backend("pytest_partial", {}, families=("topk",), page_sizes=frozenset({64})),
    )
    result = pytester.runpytest("--dsa-backend", "pytest_wrong_topk", "--dsa-family", "topk", "-k", "ragged")
    assert result.ret == 1
    n_ragged = len([c for c in all_cases() if c.family == "topk" and "ragged" in c.id])
    result.stdout.fnmatch_lines([f"*collected {N_TOPK} items / {N_TOPK - n_ragged} deselected / {n_ragged} selected*"])
    result.stdout.fnmatch_lines(["*family topk, case topk/topk/r16/l300/k32/ragged/randn: topk indices:*"])
    # Under CI=true pytest appends " - message" to summary lines, hence the trailing wildcard.
    result.stdout.fnmatch_lines(["FAILED dsa-conformance[[]pytest_wrong_topk[]]::topk/topk/r16/l300/k32/ragged/randn*"])

    result = pytester.runpytest("--dsa-backend", "pytest_partial", "-rs", "-k", "transform or indexer")
    outcomes = result.parseoutcomes()
    assert result.ret == 0 and outcomes["skipped"] > 0 and outcomes["passed"] > 0
    result.stdout.fnmatch_lines(["*not claimed: family 'indexer' not provided*",
                                 "*not claimed: page size 16 not claimed: claims one of [[]64[]]*"])


def test_kernel_error_is_reported_with_traceback(pytester):
    _register(W.make_backend("pytest_raises", {"kv_quant": W.KVQuantRaises}, families=("kv_quant",)))
    result = pytester.runpytest("--dsa-backend", "pytest_raises", "-k", "gather_index_k/p64")
    result.assert_outcomes(failed=1, deselected=len(all_cases()) - 1)
    result.stdout.fnmatch_lines(["*RuntimeError: gather kernel not compiled for this arch*"])


def test_unknown_backend_is_a_usage_error(pytester):
    result = pytester.runpytest("--dsa-backend", "no_such_backend")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*dsa-runtime conformance: unknown backend 'no_such_backend'*"])


def test_any_directory_subprocess(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DSA_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--dsa-backend", "reference", "-k", "topk/page_table", "-q",
         "-p", "no:cacheprovider"],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 passed" in proc.stdout


def test_a_backend_claiming_no_selected_case_fails_the_session(pytester):
    _register(W.make_backend("pytest_page3_only", {}, families=("topk",), page_sizes=frozenset({3})))
    result = pytester.runpytest("--dsa-backend", "pytest_page3_only", "-k", "page_table_transform", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=3)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*dsa-runtime conformance FAILED: backend pytest_page3_only claims no case of this "
                                 "selection: all 3 cases are not claimed: page size * not claimed: claims one of [[]3[]]*"])
