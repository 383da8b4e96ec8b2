"""What the Hopper GPU test modules share: the SM90 check and its ``pytestmark`` (``gpu`` + skip elsewhere), and
the warm-up-then-capture of a call in a CUDA graph. The
fixture that fails, rather than skips, a Hopper run without NVRTC is in this folder's ``conftest.py``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
NEEDS_SM90 = pytest.mark.skipif(not SM90, reason="needs an SM90 (Hopper) CUDA device")
HOPPER_GPU = [pytest.mark.gpu, NEEDS_SM90]


def cuda_graph_capture(call: Callable[[], object]) -> tuple[object, Callable[[], None]]:
    """Warm up on a side stream (compiles and autotunes), capture once; returns (static result, replay)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = call()

    def replay() -> None:
        graph.replay()
        torch.cuda.synchronize()

    return result, replay

