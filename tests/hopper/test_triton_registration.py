"""The cuda_hopper ``triton`` backend: registration, availability and ``auto`` on Hopper, without a GPU."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys

import pytest

import dsa_runtime.plugins.cuda_hopper as hopper
from dsa_runtime.plugin_manager import get_manager
from dsa_runtime.resolve import KernelConfig, resolve_kernels

HAS_TRITON = importlib.util.find_spec("triton") is not None


def test_registered_with_lazy_factories():
    backend = get_manager().get_backend("triton")
    assert backend.plugin == "cuda_hopper" and backend.platform == "cuda_hopper"
    assert {"moe", "indexer", "sparse_attn", "kv_quant", "topk"} <= set(backend.kernels)
    assert backend.capabilities.families == frozenset(backend.kernels)
    assert all(isinstance(f, str) and ":" in f for f in backend.kernels.values())
    caps = backend.capabilities
    assert caps.devices == frozenset({"cuda"})
    assert caps.unclaimed_reason("moe", device="cuda", weight_dtype="fp8_e4m3", scale_fmt="float") is None
    assert caps.unclaimed_reason("moe", device="cuda", weight_dtype="bf16", scale_fmt="ue8m0") is None
    assert caps.unclaimed_reason("topk", device="cuda", k=2048) is None
    assert "k 16385 not claimed" in caps.unclaimed_reason("topk.topk", device="cuda", k=16385)
    assert caps.unclaimed_reason("moe", device="cpu") is not None
    # the indexer's per-method claims (INDEXER_CLAIMS) win over the family-level expansion
    paged = "indexer.logits_paged"
    assert caps.unclaimed_reason(paged, device="cuda", index_heads=64, page_size=64, decode_queries=2) is None
    assert "indexer head count" in caps.unclaimed_reason(paged, device="cuda", index_heads=128, page_size=64)
    for heads, k, page in ((1, 1, 1), (20, 50, 16), (128, 2048, 64), (128, 16384, 64)):
        assert caps.unclaimed_reason("sparse_attn.prefill", device="cuda", kv_layout="bf16", heads=heads, k=k) is None
        for layout in ("bf16", "fp8_656"):
            assert caps.unclaimed_reason("sparse_attn.decode", device="cuda", kv_layout=layout, heads=heads, k=k,
                                         page_size=page, decode_queries=2) is None
    assert "head count 129" in caps.unclaimed_reason("sparse_attn.prefill", device="cuda", heads=129)
    assert "KV layout 'fp8_656'" in caps.unclaimed_reason("sparse_attn.prefill", device="cuda", kv_layout="fp8_656")


def test_unavailable_without_a_hopper_gpu(no_gpu):
    ok, why = get_manager().get_backend("triton").available()
    assert not ok and ("triton package is not installed" in why or "CUDA_VISIBLE_DEVICES" in why)


def test_unavailable_without_triton(monkeypatch):
    monkeypatch.setenv("DSA_FAKE_GPU", "NVIDIA H100 80GB HBM3:9.0")
    monkeypatch.setattr(hopper, "module_available", lambda name: False)
    ok, why = hopper.triton_available()
    assert not ok and "triton package is not installed" in why


def test_unavailable_on_blackwell(monkeypatch):
    monkeypatch.setenv("DSA_FAKE_GPU", "NVIDIA B200:10.0")
    monkeypatch.setattr(hopper, "module_available", lambda name: True)
    ok, why = hopper.triton_available()
    assert not ok and "no SM90 GPU" in why


def test_availability_check_imports_no_triton():
    code = (
        "import os, sys\n"
        "os.environ['DSA_FAKE_GPU'] = 'NVIDIA H200:9.0'\n"
        "from dsa_runtime.plugin_manager import get_manager\n"
        "print(get_manager().get_backend('triton').available()[0], 'triton' in sys.modules, 'torch' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split() == [str(HAS_TRITON), "False", "False"]


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed: the backend cannot be chosen")
def test_auto_on_hopper_resolves_moe_to_triton_with_a_logged_reason(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="dsa_runtime.resolve")
    from dsa_runtime.plugins.cuda_hopper.tilelang import sparse_attn as tl_attn

    monkeypatch.setenv("DSA_FAKE_GPU", "NVIDIA H100 80GB HBM3:9.0")
    # tilelang comes before triton for sparse_attn on Hopper: keep it out whether or not this venv has it
    monkeypatch.setattr(tl_attn, "tilelang_library", lambda: (False, "tilelang is not installed"))
    resolved = resolve_kernels(KernelConfig())
    for method in ("moe.route", "moe.experts"):
        choice = resolved.choices[method]
        assert choice.backend == "triton"
        assert choice.reason.startswith("cuda_hopper default: Triton fused grouped routing")
        assert any(r.getMessage().startswith(f"{method} -> triton (cuda_hopper default: Triton") for r in caplog.records)
    assert type(resolved.moe.experts.__self__).__name__ == "TritonMoE"
    for method in ("sparse_attn.prefill", "sparse_attn.decode"):  # FlashMLA / fa3 first when registered
        assert resolved.choices[method].backend == "triton", resolved.choices[method]
    assert resolved.choices["kv_quant.store_mla"].backend == "triton"
    assert resolved.choices["topk.topk"].backend == "triton"
    assert type(resolved.topk.topk.__self__).__name__ == "TritonTopK"


def test_auto_on_hopper_without_triton_falls_back_with_reason(monkeypatch):
    monkeypatch.setenv("DSA_FAKE_GPU", "NVIDIA H100 80GB HBM3:9.0")
    monkeypatch.setattr(hopper, "module_available", lambda name: False)
    choice = resolve_kernels(KernelConfig()).choices["moe.experts"]
    assert choice.backend == "reference"
    assert "triton package is not installed" in choice.reason


@pytest.mark.skipif(not HAS_TRITON, reason="needs the triton package (pip install -e '.[test]')")
def test_moe_variants_of_the_gpu_suite_can_reach_the_isolated_worker():
    """The GPU suite's MoE variants (scale rule x shared expert) are sent to the kit's isolated worker process,
    the default on CUDA: they must pickle (a lambda factory made them fail with ConfigError on an H200)."""
    from dsa_runtime.testing.isolate import backend_ref, load_backend_ref
    from tests.hopper.test_triton_moe_gpu import _variant

    for scale_fmt, fuse_shared in (("float", True), ("ue8m0", False)):
        ref = backend_ref(_variant(scale_fmt, fuse_shared))
        assert ref.kind == "pickle"
        backend = load_backend_ref(ref)  # what the worker rebuilds: a Backend's checks run again there
        factory = backend.kernels["moe"]
        assert factory.args == (scale_fmt,) and factory.keywords == {"fuse_shared": fuse_shared}
        assert backend.kernels["topk"] == _variant(scale_fmt, fuse_shared).kernels["topk"]
