"""What the Hopper GPU test modules share: the SM90 check and its ``pytestmark`` (``gpu`` + skip elsewhere). The
fixture that fails, rather than skips, a Hopper run without NVRTC is in this folder's ``conftest.py``."""

from __future__ import annotations

import pytest
import torch

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
NEEDS_SM90 = pytest.mark.skipif(not SM90, reason="needs an SM90 (Hopper) CUDA device")
HOPPER_GPU = [pytest.mark.gpu, NEEDS_SM90]

