"""The scan step of the sampled-bound top-k in CUDA C++ (``topk_scan.cu``).

:mod:`..triton.topk_sample` finds a lower bound of each row's k-th key from a sample, scans the row once for the
keys that reach it (in column order) and searches those candidates. At 64 x 128K the Triton scan took 27 of the
63 us (H200): one key per thread and a ``tl.cumsum`` per 2048-column chunk keep it at a quarter of copy speed.
This kernel writes the same buffers (bit for bit: the candidates are the keys ``>= t`` in column order either
way), so :func:`..triton.topk_sample.launch_sample` takes it where :func:`usable` says so and the Triton scan
otherwise; ``DSA_TOPK_SCAN_CUDA=0`` keeps the Triton scan. (A CUDA sample kernel, the same bit search with
``redux.sync`` reductions, took as long as Triton's, 11.4 against 11.7 us at 64 x 128K, and was not kept.)
"""

from __future__ import annotations

import ctypes
import functools
from importlib import resources

import torch
from torch import Tensor

from dsa_runtime.plugins.cuda_hopper.cuda import nvrtc

ENV_SWITCH = "DSA_TOPK_SCAN_CUDA"  # "0": the Triton scan


@functools.cache
def _source() -> str:
    return resources.files(__package__).joinpath("topk_scan.cu").read_text()


@functools.cache
def enabled(device_index: int) -> bool:
    """NVRTC found, an SM80+ device and :data:`ENV_SWITCH` not ``"0"`` (logged once per device when not)."""
    return nvrtc.kernel_enabled("top-k scan", ENV_SWITCH, device_index, (8, 0), "the Triton scan")


def usable(logits: Tensor) -> bool:
    """Whether this kernel can scan ``logits`` (``[R, L]`` fp32 on CUDA): rows 16-byte aligned with unit-stride
    columns and ``L % 4 == 0`` (its 16-byte loads never pass a row's end), and :func:`enabled` on the device."""
    if not (logits.is_cuda and logits.dtype == torch.float32 and logits.dim() == 2):
        return False
    if logits.stride(1) != 1 or logits.stride(0) % 4 or logits.shape[1] % 4 or logits.data_ptr() % 16:
        return False
    index = logits.device.index if logits.device.index is not None else torch.cuda.current_device()
    return enabled(index)


@functools.cache
def _kernel(device: torch.device, round_steps: int, threads: int) -> nvrtc.CudaKernel:
    if round_steps < 2 or round_steps % 2:
        raise ValueError(f"round_steps must be an even number >= 2, got {round_steps}")
    if threads % 32 or not 64 <= threads <= 1024:
        raise ValueError(f"threads must be a multiple of 32 in [64, 1024], got {threads}")
    return nvrtc.load_kernel(_source(), "topk_scan", (f"-DROUND={round_steps}", f"-DTHREADS={threads}"), 0, device)


def launch_scan(logits: Tensor, starts: Tensor, ends: Tensor, bound: Tensor, cnt: Tensor, ckey: Tensor,
                ccol: Tensor, k: int, slices: int, caps: int, round_steps: int = 2, pdl: bool = False,
                threads: int = 256) -> None:
    """Scan ``slices`` slices of every row (the Triton ``_scan_kernel``'s contract, :mod:`.topk_scan` source).

    Args:
        logits: ``[R, L]`` fp32, :func:`usable`.
        starts, ends: ``[R]`` int32 windows; bound: ``[R]`` int32 lower bounds (radix keys; ``SKIP``: none read).
        cnt: ``[R, slices]`` int32 out (each slice's full count); ckey, ccol: ``[R, slices, caps]`` int32 out.
        round_steps: 1024-column steps a thread loads per round (one 16-byte load each; the next round's are in
            flight while a round is ranked).
        pdl: launch as a programmatic dependent of the previous kernel (the kernel waits for it first).
        threads: the CTA's threads (4 columns each per step).
    """
    rows = logits.shape[0]
    if rows == 0:
        return
    ptr = ctypes.c_void_p
    _kernel(logits.device, round_steps, threads).launch((slices, rows, 1), (threads, 1, 1), [
        ptr(logits.data_ptr()), ctypes.c_longlong(logits.stride(0)), ptr(starts.data_ptr()), ptr(ends.data_ptr()),
        ptr(bound.data_ptr()), ptr(cnt.data_ptr()), ptr(ckey.data_ptr()), ptr(ccol.data_ptr()), ctypes.c_int(k),
        ctypes.c_int(slices), ctypes.c_int(caps)], pdl=pdl)
