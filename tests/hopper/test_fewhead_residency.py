"""The few-head decode's residency cache is looked up before anything is built: tensor-parallel decode runs
eager, so a warm call must neither build the probe workspace and launch arguments nor compile again.

Runs on the CPU: a stand-in kernel and device properties take the place of the compiled kernel and the GPU.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("triton", reason="needs the triton package (pip install -e '.[test]')")

import torch  # noqa: E402

from dsa_runtime.plugins.cuda_hopper.triton import fewhead_plan  # noqa: E402


class _Kernel:
    fn = SimpleNamespace(__name__="_standin_fewhead_kernel")

    def __init__(self) -> None:
        self.warmups = 0

    def warmup(self, *args, grid, **constexprs):
        self.warmups += 1
        return SimpleNamespace(n_regs=128, metadata=SimpleNamespace(shared=57856), _init_handles=lambda: None)


def test_a_warm_residency_lookup_builds_no_arguments(monkeypatch):
    monkeypatch.setattr(fewhead_plan, "INTERPRET", False)
    monkeypatch.setattr(fewhead_plan, "_RESIDENT", {})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(
        regs_per_multiprocessor=65536, shared_memory_per_multiprocessor=233472, max_threads_per_multi_processor=2048))
    kernel, built = _Kernel(), []

    def make_args():
        built.append(1)
        return ()

    device = torch.device("cuda", 0)
    consts = {"BLOCK_H": 16, "num_warps": 4, "num_stages": 3}
    # 128 registers x 128 threads: 4 by registers; 57856 + 1024 bytes of shared memory: 3 by shared memory
    assert fewhead_plan.resident_programs(kernel, make_args, consts, device) == 3
    assert (len(built), kernel.warmups) == (1, 1)
    assert fewhead_plan.resident_programs(kernel, make_args, dict(consts), device) == 3
    assert (len(built), kernel.warmups) == (1, 1)  # the hit built nothing
    fewhead_plan.resident_programs(kernel, make_args, {**consts, "num_stages": 2}, device)  # another key: built once more
    assert (len(built), kernel.warmups) == (2, 2)
