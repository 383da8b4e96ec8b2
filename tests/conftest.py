"""Shared test set-up: every test gets a fresh plugin manager and no DSA_* environment leaking in."""

from __future__ import annotations

import os

import pytest


def pytest_configure(config):
    """Under pytest-xdist, each worker takes its share of the cores as torch threads: two workers of two threads
    each on a 2-core machine spin against each other (torch's default is one thread per core per process).

    Without a GPU, child processes (TP ranks, engine processes, kit workers: hundreds in the suite) fork from a
    server that imported torch once instead of importing it again each, 2-3 s of CPU apiece
    (``dsa_runtime.processes``); a GPU host keeps the runtime's default, spawn, which is what users run."""
    import torch

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    if not torch.cuda.is_available():
        os.environ.setdefault("DSA_WORKER_MULTIPROC_METHOD", "forkserver")


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


@pytest.fixture
def one_torch_thread():
    """One torch intra-op thread for the test (restored after): the tiny models' ops are too small to split, and
    on a shared 2-core CI machine torch's threads spin against each other (measured 10x slower under load)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
