"""The CUDA top-k scan's host side without a GPU: the packaged source and when it may run (its switch:
test_fewhead_cuda_config.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="needs the triton package (pip install -e '.[test]')")
torch = pytest.importorskip("torch")

from dsa_runtime.plugins.cuda_hopper.cuda import topk_scan  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.topk import SamplePlan  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.topk_sample import uses_cuda_scan  # noqa: E402


def test_source_is_packaged_with_its_entry_point():
    src = topk_scan._source()
    assert 'extern "C" __global__' in src and "topk_scan(" in src


def test_cpu_logits_take_the_triton_scan():
    x = torch.zeros(2, 4096)
    assert topk_scan.usable(x) is False
    assert uses_cuda_scan(SamplePlan(), x) is False


def test_fused_sample_and_the_plan_switch_keep_the_triton_scan(monkeypatch):
    monkeypatch.setattr(topk_scan, "usable", lambda logits: True)  # as if on a GPU
    x = torch.zeros(2, 4096)
    monkeypatch.setattr(type(x), "is_cuda", property(lambda self: True))
    assert uses_cuda_scan(SamplePlan(), x) is True
    assert uses_cuda_scan(SamplePlan(cuda_scan=False), x) is False
    assert uses_cuda_scan(SamplePlan(fused_sample=True), x) is False

