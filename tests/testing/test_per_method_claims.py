"""Per-method claims: peer-shaped backends are certified on exactly their methods; claiming nothing fails."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

import dsa_runtime.testing.runner as runner
from dsa_runtime.backend import Backend
from dsa_runtime.capabilities import Capabilities, MethodClaim, ValueSet
from dsa_runtime.families import METHODS
from dsa_runtime.reference.plugin import KERNELS
from dsa_runtime.testing import run_conformance
from dsa_runtime.testing.registry import all_cases, method_keys
from tests.testing.peer_shaped import PEERS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"


@pytest.mark.parametrize("name", list(PEERS))
def test_peer_shaped_backend_is_certified_on_its_methods_only(name):
    make, claimed = PEERS[name]
    family = claimed[0].split(".")[0]
    report = run_conformance(make(), device="cpu", families=[family], progress=False)
    assert report.ok, report.format_table(show_passed=False)
    cases = {c.id: c for c in all_cases(families=[family])}
    ran = {}
    for res in report.cases:
        method = cases[res.id].method
        if method in claimed:
            ran.setdefault(method, []).append(res.status)
        else:  # an unclaimed method never runs (its kernel would raise AssertionError: an error, not ok)
            assert res.status == "not_claimed", (res.id, res.status, res.message)
            assert "claims []" not in res.message and res.message
    for method in claimed:
        assert "passed" in ran.get(method, []), f"no passed case of {method}"
        assert set(ran[method]) <= {"passed", "not_claimed"}


def test_unclaimed_values_have_readable_reasons():
    make, _ = PEERS["flashmla_prefill_like"]
    report = run_conformance(make(), device="cpu", families=["sparse_attn"], progress=False)
    by_id = {c.id: c for c in report.cases}
    # Heads and k outside the claim run through the caller's padding (the kernel asserts it sees only
    # claimed shapes), and say so.
    k64 = by_id["sparse_attn/prefill/h128/k64/t4/s160/pad"]
    assert (k64.status, k64.message) == ("passed", "through padding: pads k 64 -> 128")
    h20 = by_id["sparse_attn/prefill/h20/k64/t5/s80/pad"]
    assert (h20.status, h20.message) == ("passed", "through padding: pads heads 20 -> 64, k 64 -> 128")
    assert by_id["sparse_attn/prefill/h64/k128/t4/s300/pad"].message == ""  # claimed as is: no padding
    assert by_id["sparse_attn/decode/bf16/h16/k64/q1/p64/partial_pages"].message == (
        "decode is a separate kernel (flashmla_kv)")
    make, _ = PEERS["flashmla_fp8_decode_like"]
    report = run_conformance(make(), device="cpu", families=["sparse_attn"], keyword="/decode/", progress=False)
    messages = {c.message for c in report.cases if c.status == "not_claimed"}
    assert "KV layout 'bf16' not claimed: claims one of ['fp8_656']" in messages
    assert "page size 16 not claimed: claims one of [64]" in messages


def _cli(monkeypatch, capsys, backend: Backend, **kw) -> tuple[int, str, str]:
    from dsa_runtime.cli import conformance_cmd

    monkeypatch.setattr(runner, "lookup_backend", lambda name: backend)
    args = {"name": backend.name, "full": False, "device": "cpu", "family": None, "oracle_device": None,
            "keyword": None, "progress": False, "json": None, "failures_only": True, "isolate": False, "case_timeout": None, **kw}
    code = conformance_cmd.run(argparse.Namespace(**args))
    out, err = capsys.readouterr()
    return code, out, err


def test_backend_claiming_nothing_fails_with_exit_1(monkeypatch, capsys):
    nothing = Backend(name="claims_nothing", capabilities=Capabilities(), kernels={}, plugin="tests")
    code, out, err = _cli(monkeypatch, capsys, nothing, family=["topk"])
    assert code == 1
    assert "dsa-runtime: backend claims_nothing claims no case of this selection: all " in err
    assert "family 'topk' not provided" in err and "FAILED" in out


def test_claims_matching_no_case_fail_with_exit_1(monkeypatch, capsys):
    odd = Backend(
        name="odd_k", plugin="tests", kernels={"topk": KERNELS["topk"]},
        capabilities=Capabilities(devices=frozenset({"cpu"}), methods={
            "topk.topk": MethodClaim(k=ValueSet.one_of(3333))}),
    )
    code, _, err = _cli(monkeypatch, capsys, odd, family=["topk"])
    assert code == 1 and "backend odd_k claims no case of this selection" in err
    assert "k 16 not claimed: claims one of [3333]" in err or "not claimed: claims one of [3333]" in err
    # an empty selection certifies nothing either
    code, _, err = _cli(monkeypatch, capsys, odd, keyword="no-such-case")
    assert code == 1 and "no case matched the selection" in err
    # while one passed case is a pass
    report = run_conformance(PEERS["tilelang_indexer_like"][0](), device="cpu", families=["indexer"], progress=False)
    assert report.ok and report.nothing_claimed is None


def test_every_method_has_quick_cases_and_every_case_names_a_method():
    methods = {c.method for c in all_cases()}
    assert methods == set(METHODS)
    assert {c.method for c in all_cases(full=True)} == set(METHODS)


def test_docs_key_table_matches_the_case_tables():
    text = DOCS.read_text(encoding="utf-8").split("## Capability keys per method", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z_]+\.[a-z_]+)` \| ([^|]+) \|", text, flags=re.M))
    table = {m: [k.strip(" `") for k in keys.split(",")] for m, keys in rows.items()}
    assert table == method_keys(), "docs/conformance.md's key table drifted from the cases; regenerate it"
