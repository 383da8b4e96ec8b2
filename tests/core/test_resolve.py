"""Backend resolution: auto follows the platform defaults, explicit impossible choices fail with reasons."""

from __future__ import annotations

import importlib.util
import logging

import pytest

from dsa_runtime.errors import ConfigError
from dsa_runtime.families import METHODS
from dsa_runtime.plugin_manager import DSAPluginManager
from dsa_runtime.resolve import KernelConfig, resolve_kernels

from .fake_plugins import backend, plugin_registering


@pytest.fixture(autouse=True)
def _cpu_only(no_gpu):
    """These tests describe a CPU-only host; GPU hosts are simulated with DSA_FAKE_GPU, which wins."""


def manager_with(*backends) -> DSAPluginManager:
    """The installed plugins plus fakes; a fake named like a built-in backend (``deepgemm``) replaces it."""
    manager = DSAPluginManager().load()
    for b in backends:
        manager.backends.pop(b.name, None)
    if backends:
        manager.add_plugin(plugin_registering(*backends), "fakes")
        manager.collect()
    return manager


def test_auto_on_cpu_is_the_torch_backend_everywhere(caplog):
    caplog.set_level(logging.INFO, logger="dsa_runtime.resolve")
    resolved = resolve_kernels(manager=manager_with())
    assert (resolved.platform, resolved.device, resolved.kv_layout) == ("cpu", "cpu", "bf16")
    assert {c.backend for c in resolved.choices.values()} == {"torch"}
    assert list(resolved.choices) == list(METHODS)
    # Each method's choice is logged with its reason; hot-path attributes are the kernels' own bound methods.
    for method in METHODS:
        assert any(rec.getMessage().startswith(f"{method} -> torch") and "cpu default" in rec.getMessage()
                   for rec in caplog.records)
        family, name = method.split(".")
        bound = getattr(getattr(resolved, family), name)
        assert type(bound.__self__).__name__.startswith("Torch") and bound.__name__ == name


def test_cpu_falls_back_to_reference_when_torch_is_missing():
    manager = manager_with()
    del manager.backends["torch"]
    resolved = resolve_kernels(manager=manager)
    assert {c.backend for c in resolved.choices.values()} == {"reference"}
    assert all(c.reason.startswith("cpu default") for c in resolved.choices.values())  # the next preference


def test_reference_stays_selectable_on_cpu():
    resolved = resolve_kernels(KernelConfig(indexer="reference", moe="reference"), manager=manager_with())
    assert resolved.choices["indexer.logits_paged"].backend == "reference"
    assert resolved.choices["moe.experts"].backend == "reference"
    assert resolved.choices["topk.topk"].backend == "torch"


@pytest.mark.parametrize(
    ("gpu", "platform", "layout"),
    [("NVIDIA H100 80GB HBM3:9.0", "cuda_hopper", "bf16"), ("NVIDIA B200:10.0", "cuda_blackwell", "fp8_656")],
)
def test_auto_follows_platform_defaults(monkeypatch, gpu, platform, layout):
    from dsa_runtime.plugins.cuda_hopper import flashmla
    from dsa_runtime.plugins.cuda_hopper.tilelang import sparse_attn as tl_attn

    monkeypatch.setenv("DSA_FAKE_GPU", gpu)
    monkeypatch.setattr(flashmla, "flashmla_library", lambda: (False, "flash_mla is not installed"))
    monkeypatch.setattr(tl_attn, "tilelang_library", lambda: (False, "tilelang is not installed"))
    resolved = resolve_kernels(manager=manager_with())
    assert (resolved.platform, resolved.device, resolved.kv_layout) == (platform, "cuda", layout)
    prefill, decode = resolved.choices["sparse_attn.prefill"], resolved.choices["sparse_attn.decode"]
    if platform == "cuda_hopper" and importlib.util.find_spec("triton") is not None:
        # FlashMLA / fa3 are not registered; the Triton sparse MLA kernels are the next preference
        assert prefill.backend == decode.backend == "triton"
        assert prefill.reason.startswith("cuda_hopper default") and decode.reason.startswith("cuda_hopper default")
        return
    assert prefill.backend == decode.backend == "reference"
    # The FlashMLA adapters are registered (cuda_hopper) but unavailable without a built flash_mla.
    assert "backend 'flashmla_sparse' unavailable" in prefill.reason
    assert ("no 'fa3' backend registered" if layout == "bf16" else "backend 'flashmla_kv' unavailable") in decode.reason


def test_auto_prefers_the_platform_backend_when_registered(monkeypatch):
    # (the built-in cuda_hopper plugin registers the real "triton" backend, so the fake takes another name;
    # the real "deepgemm" is replaced by the fake, see manager_with)
    monkeypatch.setenv("DSA_FAKE_GPU", "NVIDIA H200:9.0")
    deepgemm = backend("deepgemm", families=("indexer",), devices=("cuda",), platform="cuda_hopper")
    resolved = resolve_kernels(manager=manager_with(deepgemm))
    has_triton = importlib.util.find_spec("triton") is not None
    assert resolved.backend_of("indexer.logits_ragged") == "deepgemm"
    assert resolved.choices["indexer.logits_ragged"].reason.startswith("cuda_hopper default")
    # paged decode logits: our Triton kernel first (measured ahead of DeepGEMM's), DeepGEMM without triton
    assert resolved.backend_of("indexer.logits_paged") == ("triton" if has_triton else "deepgemm")
    # the built-in Triton top-k of cuda_hopper, when triton is installed (else the reference, with the reason)
    assert resolved.choices["topk.topk"].backend == ("triton" if has_triton else "reference")


def test_unavailable_preferred_backend_falls_back_with_reason(monkeypatch):
    monkeypatch.setenv("DSA_FAKE_GPU", "NVIDIA H200:9.0")
    deepgemm = backend("deepgemm", families=("indexer",), devices=("cuda",), available=(False, "deep_gemm not built"))
    if importlib.util.find_spec("triton") is not None:  # the next Hopper preference, the triton indexer
        assert resolve_kernels(manager=manager_with(deepgemm)).choices["indexer.logits_ragged"].backend == "triton"
    import dsa_runtime.plugins.cuda_hopper as hopper

    real = hopper.module_available
    monkeypatch.setattr(hopper, "module_available", lambda name: name != "triton" and real(name))
    resolved = resolve_kernels(manager=manager_with(deepgemm))
    assert resolved.choices["indexer.logits_ragged"].backend == "reference"
    assert "deep_gemm not built" in resolved.choices["indexer.logits_ragged"].reason


def test_explicit_unknown_backend_lists_valid_names():
    with pytest.raises(ConfigError, match=r"unknown backend .flashmla.; registered backends: .*reference"):
        resolve_kernels(KernelConfig(sparse_attn="flashmla"), manager=manager_with())


def test_explicit_backend_without_the_family_fails_with_choices():
    with pytest.raises(ConfigError) as info:
        resolve_kernels(KernelConfig(moe="topk_only"), manager=manager_with(backend("topk_only")))
    message = str(info.value)
    assert "does not provide moe" in message and "backends that can run moe on cpu" in message
    assert message.endswith("reference, torch")


def test_explicit_backend_on_unclaimed_device_fails():
    gpu_only = backend("gpu_only", devices=("cuda",))
    with pytest.raises(ConfigError, match=r"device 'cpu' not claimed"):
        resolve_kernels(KernelConfig(topk="gpu_only"), manager=manager_with(gpu_only))


def test_explicit_unavailable_backend_fails_with_reason():
    missing = backend("needs_lib", available=(False, "flash_mla is not built"))
    with pytest.raises(ConfigError, match="unavailable: flash_mla is not built"):
        resolve_kernels(KernelConfig(topk="needs_lib"), manager=manager_with(missing))


def test_explicit_layout_must_be_claimed():
    bf16_only = backend("bf16_attn", families=("sparse_attn",), layouts=("bf16",))
    with pytest.raises(ConfigError, match="KV layout 'fp8_656' not claimed"):
        resolve_kernels(KernelConfig(sparse_attn="bf16_attn", kv_layout="fp8_656"), manager=manager_with(bf16_only))
    resolved = resolve_kernels(KernelConfig(sparse_attn="bf16_attn"), manager=manager_with(bf16_only))
    assert resolved.choices["sparse_attn.decode"].reason == "chosen for sparse_attn"


def test_explicit_platform_without_hardware_fails():
    with pytest.raises(ConfigError, match="platform 'cuda_hopper' was requested but its hardware is not present"):
        resolve_kernels(KernelConfig(platform="cuda_hopper"), manager=manager_with())


def test_unknown_kv_layout():
    with pytest.raises(ConfigError, match="unknown KV layout 'fp4'"):
        resolve_kernels(KernelConfig(kv_layout="fp4"), manager=manager_with())
