"""Programmatic dependent launch (PDL): the next kernel of a chain is scheduled while the previous one drains.

A chain of short kernels (the sampled top-k launches five at 64 x 128K) pays each launch's scheduling and the
drain of the previous grid in turn: about 2 us per boundary on an H200, replayed graphs included. With PDL
(Hopper and later) a kernel launched with ``launch_pdl=True`` may start as soon as every program of the
previous kernel has called ``griddepcontrol.launch_dependents`` (or exited); it must then call
``griddepcontrol.wait`` before it touches anything an earlier kernel wrote, and before it writes anything an
earlier kernel may still read. :func:`grid_sync` does both, first thing in a program, so a kernel that calls it
at its start is safe to launch dependent: the wait returns once the previous grid has completed and its memory
is visible, and every earlier kernel had completed before that one passed its own wait. CUDA-graph capture
keeps the programmatic edges.
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from dsa_runtime.plugins.cuda_hopper.triton.moe_quant import INTERPRET


@triton.jit
def grid_sync(PDL: tl.constexpr):
    """With ``PDL``: let the next kernel be scheduled, then wait for the previous one (its writes visible).
    Without: nothing (the interpreter and pre-Hopper GPUs)."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()


def pdl_enabled(requested: bool, device) -> bool:
    """Whether to launch with PDL: asked for, a CUDA device of compute capability 9.0 or later, not the
    interpreter. Called per top-k call (eager decode steps too): the device query is cached."""
    if not requested or INTERPRET or getattr(device, "type", "cpu") != "cuda":
        return False
    return _hopper_or_later(device.index)


@functools.cache
def _hopper_or_later(index: int | None) -> bool:
    import torch

    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl_kwargs(pdl: bool) -> dict:
    """Launch keywords: ``{"launch_pdl": True}`` when ``pdl``, else none (older launchers never see it)."""
    return {"launch_pdl": True} if pdl else {}
