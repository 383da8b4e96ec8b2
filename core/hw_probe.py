"""Cheap hardware probes for platform detection: no torch import, no device initialisation.

NVIDIA GPUs are found through NVML (``libnvidia-ml.so.1``, shipped with the driver) via ctypes, as vLLM's
platform detection does; AMD GPUs through the KFD topology in sysfs; Ascend NPUs through their device nodes.
``DSA_FAKE_GPU="NAME:MAJOR.MINOR"`` pretends one NVIDIA GPU is present (tests and docs generation).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import importlib.util
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class NvidiaGPU:
    index: int
    name: str
    capability: tuple[int, int]


@dataclass(frozen=True)
class NvidiaProbe:
    gpus: tuple[NvidiaGPU, ...]
    reason: str


@functools.lru_cache(maxsize=1)
def probe_nvidia() -> NvidiaProbe:
    """List NVIDIA GPUs with their compute capability, or say why none were found."""
    fake = os.environ.get("DSA_FAKE_GPU")
    if fake:
        name, _, cc = fake.rpartition(":")
        major, _, minor = cc.partition(".")
        return NvidiaProbe((NvidiaGPU(0, name or "fake GPU", (int(major), int(minor or 0))),), "DSA_FAKE_GPU is set")
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return NvidiaProbe((), "CUDA_VISIBLE_DEVICES hides every GPU")
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return NvidiaProbe((), "no NVIDIA driver (libnvidia-ml.so.1 not found)")
    if nvml.nvmlInit_v2() != 0:
        return NvidiaProbe((), "NVIDIA driver present but NVML failed to initialise")
    try:
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0 or count.value == 0:
            return NvidiaProbe((), "NVIDIA driver present but no GPU visible")
        gpus = []
        for i in range(count.value):
            handle = ctypes.c_void_p()
            if nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                continue
            name = ctypes.create_string_buffer(96)
            nvml.nvmlDeviceGetName(handle, name, 96)
            major, minor = ctypes.c_int(0), ctypes.c_int(0)
            nvml.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor))
            gpus.append(NvidiaGPU(i, name.value.decode(errors="replace"), (major.value, minor.value)))
        return NvidiaProbe(tuple(gpus), f"{len(gpus)} NVIDIA GPU(s) found through NVML")
    finally:
        nvml.nvmlShutdown()


def describe_gpus(gpus: tuple[NvidiaGPU, ...]) -> str:
    return ", ".join(f"{g.name} (sm_{g.capability[0]}{g.capability[1]})" for g in gpus)


@functools.lru_cache(maxsize=1)
def probe_amd() -> tuple[list[str], str]:
    """AMD GPU targets (``gfx942``...) from the KFD topology, or why none were found."""
    if not os.path.exists("/dev/kfd"):
        return [], "no /dev/kfd (ROCm kernel driver not loaded)"
    targets = []
    for props in glob.glob("/sys/class/kfd/kfd/topology/nodes/*/properties"):
        try:
            with open(props) as fh:
                for line in fh:
                    key, _, value = line.partition(" ")
                    if key == "gfx_target_version" and int(value) != 0:
                        v = int(value)
                        targets.append(f"gfx{v // 10000}{(v // 100) % 100:x}{v % 100:x}")
        except (OSError, ValueError):
            continue
    if not targets:
        return [], "/dev/kfd present but no GPU node in the KFD topology"
    return targets, f"{len(targets)} AMD GPU(s): {', '.join(targets)}"


@functools.lru_cache(maxsize=1)
def probe_ascend() -> tuple[int, str]:
    """Number of Ascend NPUs visible, and why."""
    devices = glob.glob("/dev/davinci[0-9]*")
    if not devices:
        return 0, "no /dev/davinci* device nodes (no Ascend NPU driver)"
    if importlib.util.find_spec("torch_npu") is None:
        return len(devices), f"{len(devices)} Ascend NPU(s) found but torch-npu is not installed"
    return len(devices), f"{len(devices)} Ascend NPU(s) found"


def module_available(name: str) -> bool:
    """Whether a module can be imported, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
