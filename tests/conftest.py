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
