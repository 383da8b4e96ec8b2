"""Fixtures the Hopper test modules share (pytest finds them here; nothing imports them)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def nvrtc_found() -> None:
    """Fails, rather than skips, a Hopper run without NVRTC (our CUDA C++ kernels need it). Use as
    ``pytestmark = [*HOPPER_GPU, pytest.mark.usefixtures("nvrtc_found")]``."""
    from dsa_runtime.plugins.cuda_hopper.cuda import nvrtc

    if not nvrtc.available():
        pytest.fail("NVRTC not found on a Hopper machine: torch's CUDA wheels ship it (nvidia-cuda-nvrtc)")
