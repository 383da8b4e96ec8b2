"""What the Hopper GPU test modules share: the SM90 check and its ``pytestmark`` (``gpu`` + skip elsewhere), and
the fixture that fails, rather than skips, a Hopper run without NVRTC (our CUDA C++ kernels need it)."""

from __future__ import annotations

import pytest
import torch

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
NEEDS_SM90 = pytest.mark.skipif(not SM90, reason="needs an SM90 (Hopper) CUDA device")
HOPPER_GPU = [pytest.mark.gpu, NEEDS_SM90]


@pytest.fixture(scope="module")
def nvrtc_found() -> None:
    """Use as ``pytestmark = [*HOPPER_GPU, pytest.mark.usefixtures("nvrtc_found")]`` after importing it."""
    from dsa_runtime.plugins.cuda_hopper.cuda import nvrtc

    if not nvrtc.available():
        pytest.fail("NVRTC not found on a Hopper machine: torch's CUDA wheels ship it (nvidia-cuda-nvrtc)")
