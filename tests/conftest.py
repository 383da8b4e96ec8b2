"""Shared test set-up: every test gets a fresh plugin manager and no DSA_* environment leaking in."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_plugins(monkeypatch):
    from dsa_runtime.hw_probe import probe_amd, probe_ascend, probe_nvidia
    from dsa_runtime.plugin_manager import reset_manager

    for var in ("DSA_PLUGINS", "DSA_BLOCK_PLUGINS", "DSA_TRACE_PLUGINS", "DSA_FAKE_GPU"):
        monkeypatch.delenv(var, raising=False)
    for probe in (probe_nvidia, probe_amd, probe_ascend):
        probe.cache_clear()
    reset_manager()
    yield
    for probe in (probe_nvidia, probe_amd, probe_ascend):
        probe.cache_clear()
    reset_manager()


@pytest.fixture
def no_gpu(monkeypatch):
    """Make the hardware probes see a CPU-only machine, whatever this one has (GPU hosts run the suite too)."""
    from dsa_runtime.hw_probe import probe_nvidia

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    probe_nvidia.cache_clear()
    yield
    probe_nvidia.cache_clear()
