"""Run-time compilation (NVRTC) and launching (the driver API) of our own CUDA C++ kernels, through ctypes.

No toolkit install and no build step: NVRTC ships with PyTorch's CUDA wheels (``nvidia-cuda-nvrtc``) and with
every CUDA toolkit, and the driver is already loaded by torch. Kernels are ``extern "C"`` functions without
headers; a compiled module is cached per (source, name, options, device). A launch goes on the current torch
stream through ``cuLaunchKernel``, so CUDA graphs capture it like any other kernel.

Also usable without a GPU: :func:`compile_cubin` needs only NVRTC (``bench/cuda_compile.py`` checks the
source and its register use on the CPU machine).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

logger = logging.getLogger(__name__)


class NvrtcUnavailable(RuntimeError):
    """No NVRTC library could be loaded."""


def _candidates() -> list[str]:
    paths: list[str] = []
    for base in sys.path:  # pip wheels: nvidia/cuda_nvrtc/lib (CUDA 12) or nvidia/cu13/lib (CUDA 13)
        paths += sorted(glob.glob(os.path.join(base, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*")), reverse=True)
        paths += sorted(glob.glob(os.path.join(base, "nvidia", "cu*", "lib", "libnvrtc.so*")), reverse=True)
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            paths += sorted(glob.glob(os.path.join(home, "lib64", "libnvrtc.so*")), reverse=True)
    extra = os.environ.get("DSA_NVRTC_LIB")
    return ([extra] if extra else []) + ["libnvrtc.so"] + [p for p in paths if "builtins" not in p and ".alt." not in p]


@functools.cache
def nvrtc() -> ctypes.CDLL:
    """The NVRTC library (``DSA_NVRTC_LIB`` first, then pip wheels, ``CUDA_HOME``, ``/usr/local/cuda``)."""
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path)
        except OSError as exc:
            errors.append(f"{path}: {exc}")
    raise NvrtcUnavailable("NVRTC not found (pip install nvidia-cuda-nvrtc-cu12, or set DSA_NVRTC_LIB); tried "
                           + "; ".join(errors[:4]))


def available() -> bool:
    try:
        nvrtc()
    except NvrtcUnavailable:
        return False
    return True


def kernel_enabled(what: str, env_switch: str, device_index: int, min_capability: tuple[int, int],
                   fallback: str) -> bool:
    """Whether one of our CUDA kernels runs on a device: ``env_switch`` not ``"0"`` (read before any device
    query), compute capability ``>= min_capability`` and NVRTC found. When it is not, the reason is logged at
    INFO as ``"<what>: <reason>; <fallback> runs"``. Callers cache the answer per device."""
    if os.environ.get(env_switch, "1") == "0":
        logger.info("%s: the CUDA kernel is off (%s=0); %s runs", what, env_switch, fallback)
        return False
    if torch.cuda.get_device_capability(device_index) < min_capability:
        return False
    try:
        nvrtc()
    except NvrtcUnavailable as exc:
        logger.info("%s: %s; %s runs", what, exc, fallback)
        return False
    return True


def compile_cubin(source: str, arch: str, options: Sequence[str] = ()) -> bytes:
    """Compile ``source`` for ``arch`` (``"sm_90"``) to a cubin; raises ``RuntimeError`` with NVRTC's log."""
    lib = nvrtc()
    prog = ctypes.c_void_p()
    lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernel.cu", 0, None, None)
    opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17", b"-default-device"] + [o.encode() for o in options]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    try:
        res = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        if res != 0:
            raise RuntimeError(f"NVRTC failed ({res}) for {arch}:\n{log.value.decode(errors='replace')}")
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        if lib.nvrtcGetCUBIN(prog, cubin) != 0:
            raise RuntimeError("NVRTC produced no cubin")
        return cubin.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


@functools.cache
def _driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def _check(res: int, what: str) -> None:
    if res != 0:
        msg = ctypes.c_char_p()
        _driver().cuGetErrorString(res, ctypes.byref(msg))
        raise RuntimeError(f"{what} failed: CUDA error {res} ({(msg.value or b'?').decode()})")


_CU_FUNC_ATTRIBUTE_NUM_REGS = 4
_CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute``: an id, padding to 8 bytes, a 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` (cuLaunchKernelEx, CUDA 12+)."""

    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem_bytes", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


@dataclass
class CudaKernel:
    """A loaded kernel: launch with :meth:`launch` on the current stream."""

    function: ctypes.c_void_p
    module: ctypes.c_void_p
    dynamic_smem: int
    registers: int
    local_bytes: int
    _resident: dict[int, int] = field(default_factory=dict, repr=False)

    def resident_blocks(self, block_threads: int) -> int:
        """Blocks of ``block_threads`` threads one SM holds at once (the driver's occupancy calculator, asked
        once per block size: decode steps call this every time)."""
        n = self._resident.get(block_threads)
        if n is None:
            got = ctypes.c_int()
            _check(_driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(
                ctypes.byref(got), self.function, ctypes.c_int(block_threads), ctypes.c_size_t(self.dynamic_smem)),
                "cuOccupancyMaxActiveBlocksPerMultiprocessor")
            n = self._resident[block_threads] = got.value
        return n

    def launch(self, grid: tuple[int, int, int], block: tuple[int, int, int], args: Sequence[ctypes._SimpleCData],
               stream: int | None = None, pdl: bool = False) -> None:
        """Launch with ``args`` as ctypes scalars (``c_void_p`` for device pointers) on ``stream`` (the
        current torch stream by default). ``pdl``: as a programmatic dependent launch (``cuLaunchKernelEx``,
        Hopper and later): the kernel may start while the previous one drains, so it must execute
        ``griddepcontrol.wait`` before it touches memory (see :mod:`..triton.pdl`)."""
        if stream is None:
            stream = torch.cuda.current_stream().cuda_stream
        ptrs = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in args])
        if not pdl:
            _check(_driver().cuLaunchKernel(self.function, *[ctypes.c_uint(v) for v in grid],
                                            *[ctypes.c_uint(v) for v in block], ctypes.c_uint(self.dynamic_smem),
                                            ctypes.c_void_p(stream), ptrs, None), "cuLaunchKernel")
            return
        attr = _LaunchAttribute(id=_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
        attr.value[0] = 1  # programmaticStreamSerializationAllowed
        config = _LaunchConfig((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), self.dynamic_smem,
                               ctypes.c_void_p(stream), ctypes.pointer(attr), 1)
        _check(_driver().cuLaunchKernelEx(ctypes.byref(config), self.function, ptrs, None), "cuLaunchKernelEx")


_LOADED: dict[tuple, CudaKernel] = {}


def load_kernel(source: str, name: str, options: Sequence[str], dynamic_smem: int, device: torch.device,
                arch_suffix: str = "") -> CudaKernel:
    """Compile (once per source, options and device architecture) and load kernel ``name`` on ``device``;
    ``arch_suffix="a"`` targets the architecture-specific features (``sm_90a``: ``wgmma``, ``setmaxnreg``)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (source, name, tuple(options), dynamic_smem, index, arch_suffix)  # the text itself: a hash may collide
    kern = _LOADED.get(key)
    if kern is not None:
        return kern
    major, minor = torch.cuda.get_device_capability(index)
    cubin = compile_cubin(source, f"sm_{major}{minor}{arch_suffix}", options)
    with torch.cuda.device(index):  # torch's (primary) context of that device is current on this thread
        drv = _driver()
        module = ctypes.c_void_p()
        _check(drv.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(cubin)), "cuModuleLoadData")
        function = ctypes.c_void_p()
        _check(drv.cuModuleGetFunction(ctypes.byref(function), module, name.encode()), "cuModuleGetFunction")
        if dynamic_smem > 48 * 1024:
            _check(drv.cuFuncSetAttribute(function, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                          ctypes.c_int(dynamic_smem)), "cuFuncSetAttribute")
        regs, local = ctypes.c_int(), ctypes.c_int()
        drv.cuFuncGetAttribute(ctypes.byref(regs), _CU_FUNC_ATTRIBUTE_NUM_REGS, function)
        drv.cuFuncGetAttribute(ctypes.byref(local), _CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, function)
    kern = _LOADED[key] = CudaKernel(function, module, dynamic_smem, regs.value, local.value)
    return kern
