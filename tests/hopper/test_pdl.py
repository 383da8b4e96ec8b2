"""Programmatic dependent launch helpers: off wherever the device cannot take it."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from dsa_runtime.plugins.cuda_hopper.triton.pdl import pdl_enabled, pdl_kwargs  # noqa: E402


def test_pdl_off_on_cpu_and_when_not_asked() -> None:
    assert pdl_enabled(True, torch.device("cpu")) is False
    assert pdl_enabled(False, torch.device("cpu")) is False
    assert pdl_enabled(False, torch.device("cuda", 0)) is False  # not asked: no device query either


def test_pdl_kwargs_only_when_on() -> None:
    assert pdl_kwargs(True) == {"launch_pdl": True}
    assert pdl_kwargs(False) == {}


@pytest.mark.gpu
def test_pdl_on_hopper() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    major = torch.cuda.get_device_capability(0)[0]
    assert pdl_enabled(True, torch.device("cuda", 0)) is (major >= 9)
