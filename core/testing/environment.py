"""What a conformance report records about the run's environment: the backend's package, the device, the
versions of torch, CUDA runtime and driver. Every value is a string; ``"-"`` when it cannot be known.
"""

from __future__ import annotations

import platform
import sys
from importlib import metadata

import torch

from dsa_runtime.backend import Backend

UNKNOWN = "-"


def backend_package(backend: Backend) -> tuple[str, str]:
    """``(distribution name, version)`` that provides the backend's plugin, found through the plugin's entry
    point (any dsa-runtime entry-point group); ``("-", "-")`` for in-process backends and unknown plugins."""
    from dsa_runtime.plugin_manager import GROUPS

    if not backend.plugin:
        return UNKNOWN, UNKNOWN
    for group in GROUPS:
        try:
            eps = metadata.entry_points(group=group)
        except Exception:  # broken metadata of some unrelated distribution must not end the report
            continue
        for ep in eps:
            dist = getattr(ep, "dist", None)
            if ep.name == backend.plugin and dist is not None:
                return dist.name, dist.version
    return UNKNOWN, UNKNOWN


def device_name(device: torch.device) -> str:
    """``torch.cuda.get_device_name`` for CUDA, else the CPU's name as the OS reports it (``"cpu"`` if none)."""
    if device.type == "cuda":
        try:
            return torch.cuda.get_device_name(device)
        except Exception:
            return UNKNOWN
    return platform.processor() or platform.machine() or "cpu"


def _cuda_driver_version() -> str:
    """The driver's CUDA version (``cuDriverGetVersion``: 12040 -> ``12.4``), when a driver is present."""
    if sys.platform == "win32":
        return UNKNOWN
    try:
        import ctypes

        v = ctypes.c_int(0)
        lib = ctypes.CDLL("libcuda.so.1")
        if lib.cuDriverGetVersion(ctypes.byref(v)) != 0 or v.value == 0:
            return UNKNOWN
        return f"{v.value // 1000}.{v.value % 1000 // 10}"
    except Exception:
        return UNKNOWN


def _nvidia_driver() -> str:
    """The NVIDIA kernel driver version (e.g. ``550.54.15``) from /proc, when present."""
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as fh:
            first = fh.readline()
    except OSError:
        return UNKNOWN
    for word in first.split():
        if word.count(".") >= 1 and word.replace(".", "").isdigit():
            return word
    return UNKNOWN


def collect(backend: Backend, device: torch.device, *, name_device: bool = True) -> dict[str, str]:
    """The ``Report.environment`` mapping (keys: :data:`dsa_runtime.testing.report.ENVIRONMENT_KEYS`).

    ``name_device=False`` leaves ``device_name`` as ``"-"``: asking CUDA for it creates a context, which an
    isolated run's parent process avoids (its worker reports the name instead).
    """
    package, version = backend_package(backend)
    env = {
        "backend_package": package,
        "backend_package_version": version,
        "device_name": device_name(device) if name_device or device.type != "cuda" else UNKNOWN,
        "platform": platform.platform(terse=True),
        "python_version": platform.python_version(),
        "cuda_runtime_version": torch.version.cuda or UNKNOWN,
        "cuda_driver_version": UNKNOWN,
    }
    if torch.cuda.is_available():
        # Both: the kernel driver's own version and the CUDA version it supports.
        env["cuda_driver_version"] = f"{_nvidia_driver()} (CUDA {_cuda_driver_version()})"
    return env
