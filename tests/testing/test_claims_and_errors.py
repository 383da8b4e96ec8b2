"""Capability claims become not_claimed results with reasons; kernel exceptions become errors, not crashes."""

from __future__ import annotations

import pytest

from dsa_runtime.backend import Backend
from dsa_runtime.capabilities import Capabilities
from dsa_runtime.errors import ConfigError
from dsa_runtime.reference.plugin import KERNELS
from dsa_runtime.testing import run_conformance
from tests.testing import wrong_backends as W


def test_partial_claims_are_listed_with_reasons():
    backend = W.make_backend(
        "partial", {}, families=("topk", "kv_quant", "sparse_attn"), kv_layouts=frozenset({"bf16"}),
        page_sizes=frozenset({64}), head_counts=frozenset({64, 128}), max_decode_queries=1,
        not_claimed={"moe": "experts run on the vendor's GEMM library, not certified yet"},
    )
    report = run_conformance(backend, progress=False)
    by_id = {c.id: c for c in report.cases}
    assert report.ok
    assert len(by_id) == len(report.cases) and {c.family for c in report.cases} == {
        "indexer", "topk", "sparse_attn", "kv_quant", "moe", "moe_comm"}
    assert by_id["moe/route/e256/g8x4/k8/t33/renorm/s2.5/random"].message == (
        "experts run on the vendor's GEMM library, not certified yet")
    assert by_id["indexer/quantize_k/n37/ue8m0/bf16/random"].message == "family 'indexer' not provided"
    fp8 = by_id["kv_quant/quantize_mla/fp8_656/ue8m0/n40/random"]
    assert fp8.status == "not_claimed" and "KV layout 'fp8_656' not claimed" in fp8.message
    assert "page size 16 not claimed" in by_id["kv_quant/store_mla/bf16/p16/n30"].message
    h20 = by_id["sparse_attn/prefill/h20/k64/t5/s80/pad"]  # runs through the caller's head padding
    assert (h20.status, h20.message) == ("passed", "through padding: pads heads 20 -> 64")
    assert by_id["sparse_attn/decode/bf16/h128/k32/q2/p64/short"].message == (
        "decode queries per request 2 not claimed: claims values in [1, 1]")
    assert by_id["sparse_attn/prefill/h64/k64/t4/s96/empty"].status == "passed"
    assert by_id["kv_quant/store_mla/bf16/p64/n30"].status == "passed"
    assert report.summary["not_claimed"] > 0 and report.summary["passed"] > 0
    table = report.format_table()
    assert "not claimed" in table and "KV layout 'fp8_656' not claimed" in table


def test_kernel_exception_is_an_error_and_the_run_goes_on():
    report = run_conformance(W.make_backend("raises", {"kv_quant": W.KVQuantRaises}), families=["kv_quant"], progress=False)
    errors = [c for c in report.cases if c.status == "error"]
    assert {c.id for c in errors} == {"kv_quant/gather_index_k/p64/n30", "kv_quant/gather_index_k/p16/n30"}
    assert all("RuntimeError: gather kernel not compiled" in c.message and "family kv_quant" in c.message for c in errors)
    assert isinstance(errors[0].exception, RuntimeError)
    assert report.summary["passed"] == len(report.cases) - 2 and not report.ok


def test_missing_method_and_bad_factory_are_errors():
    class NoTopK:
        pass

    def broken():
        raise ImportError("libvendor.so: cannot open shared object file")

    backend = Backend(
        name="broken",
        capabilities=Capabilities(families=frozenset({"topk", "moe"})),
        kernels={"topk": NoTopK, "moe": broken},
    )
    report = run_conformance(backend, families=["topk", "moe"], keyword="/r8/l256/k16/", progress=False)
    assert [c.status for c in report.cases] == ["error"]
    assert "AttributeError" in report.cases[0].message
    report = run_conformance(backend, families=["moe"], keyword="route/e16", progress=False)
    assert report.cases[0].status == "error" and "libvendor.so" in report.cases[0].message


def test_device_errors():
    npu_only = Backend(
        name="npu_only", capabilities=Capabilities(families=frozenset({"topk"}), devices=frozenset({"npu"})),
        kernels={"topk": KERNELS["topk"]},
    )
    with pytest.raises(ConfigError, match="claims devices \\['npu'\\], none available"):
        run_conformance(npu_only)
    unavailable = Backend(
        name="gone", capabilities=Capabilities(families=frozenset({"topk"})), kernels={"topk": KERNELS["topk"]},
        available=lambda: (False, "flash_mla not built"),
    )
    with pytest.raises(ConfigError, match="not available here: flash_mla not built"):
        run_conformance(unavailable)
    with pytest.raises(ConfigError, match="unknown backend 'nope'"):
        run_conformance("nope")
    with pytest.raises(ConfigError, match="unknown kernel family"):
        run_conformance("reference", families=["attention"])


def test_explicit_unclaimed_device_is_not_claimed_not_an_error():
    cuda_only = W.make_backend("cuda_only", {}, families=("topk",), devices=frozenset({"cuda"}))
    report = run_conformance(cuda_only, device="cpu", families=["topk"], progress=False)
    assert report.summary["not_claimed"] == len(report.cases) > 0
    assert "device 'cpu' not claimed" in report.cases[0].message


def test_lost_device_context_marks_the_rest_not_run(monkeypatch):
    """After a device-side assert every later call fails: the rest are errors saying so, the run ends cleanly."""
    import dsa_runtime.testing.runner as runner

    monkeypatch.setattr(runner, "_device_alive", lambda dev: False)
    backend = W.make_backend("asserts", {"kv_quant": W.KVQuantRaises}, families=("kv_quant", "topk"),
                             page_sizes=frozenset({64}))
    report = run_conformance(backend, device="cpu", families=["kv_quant", "topk"], progress=False)
    statuses = [c.status for c in report.cases]
    first = statuses.index("error")
    assert report.cases[first].id == "kv_quant/gather_index_k/p64/n30"
    after = report.cases[first + 1 :]
    assert after and all(c.status in ("error", "not_claimed") for c in after)
    assert any(c.status == "not_claimed" for c in after)  # claims are still reported as such
    assert "not run: the cpu context was lost in case kv_quant/gather_index_k/p64/n30" in after[-1].message
