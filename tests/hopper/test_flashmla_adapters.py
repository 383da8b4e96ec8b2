"""The FlashMLA adapters without a GPU: registration, exact claims, availability reasons, ``auto`` on Hopper,
layout translation (through a stand-in ``flash_mla`` in plain PyTorch) and the core's head / k padding."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

from dsa_runtime.cli.plugins_cmd import collect
from dsa_runtime.padding import PaddedSparseAttn
from dsa_runtime.plugin_manager import get_manager
from dsa_runtime.plugins.cuda_hopper import flashmla
from dsa_runtime.reference.sparse_attn import ReferenceSparseAttn
from dsa_runtime.resolve import KernelConfig, resolve_kernels
from dsa_runtime.testing.fp8util import pack_mla_656
from tests.hopper import fake_flash_mla

H100 = "NVIDIA H100 80GB HBM3:9.0"
V32 = {"heads": 128, "k": 2048, "page_size": 64, "decode_queries": 1}


@pytest.fixture
def fake_lib(monkeypatch):
    """A built ``flash_mla`` (the stand-in) and an SM90 GPU as the NVML probe sees it."""
    mod = fake_flash_mla.make()
    monkeypatch.setitem(sys.modules, "flash_mla", mod)
    monkeypatch.setenv("DSA_FAKE_GPU", H100)
    return mod


def test_registered_with_exact_claims():
    manager = get_manager()
    pre, dec = manager.get_backend("flashmla_sparse"), manager.get_backend("flashmla_kv")
    assert pre.plugin == dec.plugin == "cuda_hopper"
    assert pre.capabilities.claimed_methods() == ["sparse_attn.prefill"]
    assert dec.capabilities.claimed_methods() == ["sparse_attn.decode"]
    ok = pre.capabilities.unclaimed_reason
    assert ok("sparse_attn.prefill", device="cuda", kv_layout="bf16", heads=64, k=128) is None
    assert ok("sparse_attn.prefill", device="cuda", kv_layout="bf16", heads=128, k=16384) is None
    for bad in ({"heads": 96}, {"k": 64}, {"k": 192}, {"device": "cpu"}, {"kv_layout": "fp8_656"}):
        needs = {"device": "cuda", "kv_layout": "bf16", "heads": 128, "k": 2048} | bad
        assert ok("sparse_attn.prefill", **needs) is not None, bad
    assert "flashmla_kv" in ok("sparse_attn.decode", device="cuda")
    ok = dec.capabilities.unclaimed_reason
    good = {"device": "cuda", "kv_layout": "fp8_656", "heads": 64, "k": 64, "page_size": 64, "decode_queries": 2}
    assert ok("sparse_attn.decode", **good) is None
    for bad in ({"kv_layout": "bf16"}, {"heads": 32}, {"k": 96}, {"page_size": 16}, {"decode_queries": 3}):
        assert ok("sparse_attn.decode", **(good | bad)) is not None, bad
    assert "flashmla_sparse" in ok("sparse_attn.prefill", device="cuda")


def test_unavailable_without_flash_mla_with_the_reason_in_plugins(monkeypatch):
    monkeypatch.setenv("DSA_FAKE_GPU", H100)
    monkeypatch.delitem(sys.modules, "flash_mla", raising=False)
    monkeypatch.setattr(flashmla.importlib.util, "find_spec", lambda name: None)
    backends = {b["name"]: b for p in collect()["plugins"] for b in p["backends"]}
    for name in ("flashmla_sparse", "flashmla_kv"):
        assert backends[name]["available"] is False
        assert "flash_mla is not installed" in backends[name]["reason"]
        assert "build_flashmla.sh" in backends[name]["reason"]


def test_source_checkout_without_a_build_is_unavailable(monkeypatch, tmp_path):
    (tmp_path / "flash_mla").mkdir()
    (tmp_path / "flash_mla" / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_mla", raising=False)
    ok, why = flashmla.flashmla_library()
    assert not ok and "not built" in why
    (tmp_path / "flash_mla" / "cuda.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    ok, why = flashmla.flashmla_library()
    assert ok and str(tmp_path) in why


def test_unavailable_without_an_sm90_gpu(monkeypatch, fake_lib):
    monkeypatch.setenv("DSA_FAKE_GPU", "NVIDIA B200:10.0")
    ok, why = get_manager().get_backend("flashmla_kv").available()
    assert not ok and "no SM90 GPU" in why


def test_discovery_imports_neither_flash_mla_nor_torch():
    code = (
        "import os, sys\n"
        "os.environ['DSA_FAKE_GPU'] = 'NVIDIA H200:9.0'\n"
        "from dsa_runtime.plugin_manager import get_manager\n"
        "ok, why = get_manager().get_backend('flashmla_kv').available()\n"
        "print(ok, 'flash_mla' in sys.modules, 'torch' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split()[1:] == ["False", "False"]


def test_auto_on_hopper_picks_the_adapters_with_logged_reasons(fake_lib, caplog):
    caplog.set_level(logging.INFO, logger="dsa_runtime.resolve")
    resolved = resolve_kernels(KernelConfig(kv_layout="fp8_656"), needs=V32)
    pre, dec = resolved.choices["sparse_attn.prefill"], resolved.choices["sparse_attn.decode"]
    assert pre.backend == "flashmla_sparse" and pre.reason.startswith("cuda_hopper default: SGLang's Hopper")
    # fa3 (first in the decode list) is not registered: the logged default reason says so.
    assert dec.backend == "flashmla_kv" and "fa3 decode (not provided here)" in dec.reason
    logged = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("sparse_attn.decode -> flashmla_kv (cuda_hopper default: SGLang") for m in logged)
    assert type(resolved.sparse_attn.decode.__self__).__name__ == "FlashMLAKV"
    assert not isinstance(resolved.sparse_attn.prefill, PaddedSparseAttn) or "pads" not in pre.reason


def test_bf16_cache_decode_skips_flashmla_kv_with_the_reason(fake_lib):
    resolved = resolve_kernels(KernelConfig(), needs=V32)  # Hopper's default KV layout is bf16
    assert resolved.kv_layout == "bf16"
    assert resolved.choices["sparse_attn.prefill"].backend == "flashmla_sparse"
    dec = resolved.choices["sparse_attn.decode"]
    assert dec.backend in ("tilelang", "triton", "reference")  # tilelang when installed
    assert "backend 'flashmla_kv': sparse_attn.decode: KV layout 'bf16' not claimed" in dec.reason


def test_unpaddable_shapes_fall_back_with_the_reason(fake_lib):
    resolved = resolve_kernels(KernelConfig(kv_layout="fp8_656"), needs=V32 | {"heads": 130, "decode_queries": 3})
    for method in ("sparse_attn.prefill", "sparse_attn.decode"):
        choice = resolved.choices[method]
        assert choice.backend not in ("flashmla_sparse", "flashmla_kv")
        assert "head count 130 not claimed" in choice.reason or "decode queries per request 3" in choice.reason


def test_without_flash_mla_auto_falls_back(monkeypatch):
    monkeypatch.setenv("DSA_FAKE_GPU", H100)
    monkeypatch.delitem(sys.modules, "flash_mla", raising=False)
    monkeypatch.setattr(flashmla.importlib.util, "find_spec", lambda name: None)
    resolved = resolve_kernels(KernelConfig(kv_layout="fp8_656"), needs=V32)
    assert "backend 'flashmla_sparse' unavailable: flash_mla is not installed" in (
        resolved.choices["sparse_attn.prefill"].reason)
    assert "backend 'flashmla_kv' unavailable" in resolved.choices["sparse_attn.decode"].reason


def _prefill_inputs(gen, heads, tokens=5, n_kv=90, k=32):
    q = torch.randn(tokens, heads, 576, generator=gen).bfloat16()
    kv = torch.randn(n_kv, 576, generator=gen).bfloat16()
    idx = torch.stack([torch.randperm(n_kv, generator=gen)[:k] for _ in range(tokens)]).to(torch.int32)
    idx[0] = -1  # an empty query: zeros and lse +inf
    idx[1, ::3] = -1
    return q, kv, idx


def _decode_inputs(gen, heads, batch=3, n_q=2, pages=4, k=40):
    c = torch.randn(pages * 64, 512, generator=gen).bfloat16()
    k_pe = torch.randn(pages * 64, 64, generator=gen).bfloat16()
    cache = pack_mla_656(c, k_pe, "ue8m0").reshape(pages, 64, 656)
    q = torch.randn(batch, n_q, heads, 576, generator=gen).bfloat16()
    idx = torch.stack([torch.randperm(pages * 64, generator=gen)[:k] for _ in range(batch * n_q)])
    idx = idx.reshape(batch, n_q, k).to(torch.int32)
    idx[0, 0] = -1
    idx[1, :, ::4] = -1
    return q, cache, idx


@pytest.mark.parametrize("generation", ["new", "old", "sgl"])
def test_padded_calls_translate_layouts_and_equal_the_reference(monkeypatch, generation):
    """4 heads and k 32 / 40 reach the library as 64 heads, k 128 / 64, [.., 1, ..] axes; results trimmed."""
    lib = fake_flash_mla.make(generation)
    monkeypatch.setitem(sys.modules, "flash_mla", lib)
    monkeypatch.setenv("DSA_FAKE_GPU", H100)
    # Chosen by name: auto prefers triton, which runs 4 heads without padding.
    cfg = KernelConfig(kv_layout="fp8_656", sparse_attn_prefill="flashmla_sparse", sparse_attn_decode="flashmla_kv")
    resolved = resolve_kernels(cfg, needs=V32 | {"heads": 4, "k": 32})
    assert resolved.choices["sparse_attn.prefill"].reason.endswith("pads heads 4 -> 64, k 32 -> 128")
    assert resolved.choices["sparse_attn.decode"].reason.endswith("pads heads 4 -> 64, k 32 -> 64")
    ref, gen = ReferenceSparseAttn(), torch.Generator().manual_seed(7)

    q, kv, idx = _prefill_inputs(gen, 4)
    out, lse = resolved.sparse_attn.prefill(q, kv, idx, 0.135234)
    want_out, want_lse = ref.prefill(q, kv, idx, 0.135234)
    assert out.shape == (5, 4, 512) and lse.shape == (5, 4)
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    torch.testing.assert_close(lse, want_lse, rtol=1e-6, atol=1e-5)
    assert torch.isposinf(lse[0]).all() and (out[0] == 0).all()

    q, cache, idx = _decode_inputs(gen, 4)
    out, lse = resolved.sparse_attn.decode(q, cache, idx, 0.135234, layout="fp8_656")
    want_out, want_lse = ref.decode(q, cache, idx, 0.135234, layout="fp8_656")
    assert out.shape == (3, 2, 4, 512) and lse.shape == (3, 2, 4) and lse.is_contiguous()
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=0)
    assert [c[0] for c in lib.calls] == ["prefill", "decode"]
    assert lib.calls[0][1:] == ((5, 64, 576), (90, 1, 576), (5, 1, 128))
    assert lib.calls[1][1:] == ((3, 2, 64, 576), (4, 64, 1, 656), (3, 2, 64))


def test_decode_reuses_scheduling_per_shape(fake_lib):
    kern = flashmla.FlashMLAKV()
    gen = torch.Generator().manual_seed(3)
    for heads in (64, 64, 128):
        q, cache, idx = _decode_inputs(gen, heads, k=64)
        kern.decode(q, cache, idx, 0.1, layout="fp8_656")
    assert len(kern._meta) == 2  # one per (batch, queries, heads, k, device)
    with pytest.raises(ValueError, match="fp8_656 cache only"):
        kern.decode(q, cache, idx, 0.1, layout="bf16")
