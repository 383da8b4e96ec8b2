"""Few-head sparse MLA decode over an ``fp8_656`` cache in CUDA C++ (``fewhead_fp8.cu``).

At 16 heads per rank (V3.2 under TP 8) the Triton kernel (:mod:`..triton.sparse_mla_decode_fewhead`) spends about
190 warp instructions per selected row: Triton converts each gathered e4m3 tile once per product through layout
conversions. Written against ``mma.sync`` fragments directly, a row costs about 94 (SASS, four warps): the fp8
bytes go from shared memory into MMA operands with one conversion (scores) or one byte permute and one conversion
(values) per register, and each warp multiplies only its own 128 latent columns, so nothing but the scores
crosses warps; the CTA copies whole rows into one shared ring. See the ``.cu`` file for the layout of the work. On
an H200 at 16 heads, batch 64, k 2048: 0.049 ms against the Triton kernel's 0.089 and padded FlashMLA's 0.091
(``docs/benchmarks.md``). At 32 heads (TP 4) each query runs as two groups of 16 heads whose CTAs are launched
side by side, so the rows one group brings from DRAM are mostly read by the other from the L2: 0.072 ms against
the Triton kernel's 0.109 and padded FlashMLA's 0.091. The slices' partials travel to the merge in fp16, each
128-column block divided by its reference row scale (half the bytes of fp32, with fp32's accuracy against the
reference; bf16 doubled the error).

Compiled at first use by NVRTC (:mod:`.nvrtc`); slices of each query's rows are planned from the loaded kernel's
residency as in the Triton kernel (:func:`..triton.fewhead_plan.plan_splits`) and merged by a second launch, a
programmatic dependent one on Hopper (:mod:`..triton.pdl`): it is scheduled while this kernel's last CTAs run.
The decode itself is launched as a programmatic dependent too (``pdl_main``): its CTAs are placed while the kernel
before it drains and wait (``griddepcontrol.wait``) before their first memory access; in a graph of 16 decode
calls (a decode step's layers) that took 0.0408 ms per call against 0.0414 (H200).
(Merging in the same launch, by the last slice of each query to finish, was measured slower: docs/benchmarks.md.)
"""

from __future__ import annotations

import ctypes
import functools
import math
import re
from dataclasses import dataclass
from importlib import resources

import torch
from torch import Tensor

from dsa_runtime.families import D_LATENT, FP8_MLA_ROW_BYTES
from dsa_runtime.plugins.cuda_hopper.cuda import nvrtc
from dsa_runtime.plugins.cuda_hopper.triton.fewhead_plan import FewHeadConfig, plan_splits, slice_rows
from dsa_runtime.plugins.cuda_hopper.triton.mla_fp8_decode import (
    LOG2E,
    flatten_decode_inputs,
    merge_slices,
    sm_count,
)
from dsa_runtime.plugins.cuda_hopper.triton.pdl import pdl_enabled

GROUP_HEADS = 16  # heads per CTA (the MMA's M); more heads run as groups of 16
MAX_HEADS = 32
THREADS = 128
L2_PREFETCH_BYTES = (0, 64, 128, 256)
ENV_SWITCH = "DSA_FEWHEAD_CUDA"  # "0": the Triton backend keeps its Triton few-head kernel for fp8_656


@dataclass(frozen=True)
class CudaFewHeadConfig:
    """``stages``: shared-memory ring depth (chunks of 32 whole rows; ``stages - 1`` in flight while one is
    multiplied);
    ``min_blocks``: the launch bound (CTAs per SM the compiler must fit in registers); ``splits``: fixed slices per
    query (0 = planned from the residency); ``min_rows``: fewest rows per planned slice; ``rescale_slack``: how far
    (base 2) a head's score may pass the running max before the accumulators are rescaled (0 = every time it
    moves); ``ref_slack``: likewise, the factor a row scale may pass the reference scale by; ``l2_prefetch``: the
    L2 prefetch size in bytes the row copies ask for (0 = none); ``pdl_merge``: launch the merge of the slices as
    a programmatic dependent (Hopper and later); ``partial_fp16``: the slices' normalised partials in fp16, each
    128-column block divided by its reference row scale (half the bytes of fp32 written and merged), else fp32;
    ``pdl_main``: launch the decode itself as a programmatic dependent of the kernel before it (Hopper and later;
    it waits for that kernel before its first memory access)."""

    stages: int = 2
    min_blocks: int = 2
    splits: int = 0
    min_rows: int = 128
    rescale_slack: float = 8.0
    ref_slack: float = 16.0
    l2_prefetch: int = 128
    pdl_merge: bool = True
    partial_fp16: bool = True
    pdl_main: bool = True

    @property
    def label(self) -> str:
        return (f"cuda_s{self.stages}_b{self.min_blocks}_r{self.rescale_slack:g}_{self.ref_slack:g}"
                + (f"_x{self.splits}" if self.splits else "") + f"_l2p{self.l2_prefetch}"
                + ("" if self.pdl_merge else "_nopdl") + ("" if self.partial_fp16 else "_pf32")
                + ("" if self.pdl_main else "_nopdlmain"))

    @property
    def options(self) -> tuple[str, ...]:
        if self.stages < 2:
            raise ValueError("stages must be at least 2")
        if not (0.0 <= self.rescale_slack <= 10.0 and 1.0 <= self.ref_slack <= 16.0):
            raise ValueError("rescale_slack must be in [0, 10] and ref_slack in [1, 16] (fp16 probabilities)")
        if self.l2_prefetch not in L2_PREFETCH_BYTES:
            raise ValueError(f"l2_prefetch must be one of {L2_PREFETCH_BYTES}, got {self.l2_prefetch}")
        return (f"-DSTAGES={self.stages}", f"-DMIN_BLOCKS={self.min_blocks}",
                f"-DRESCALE_SLACK={self.rescale_slack:.1f}f", f"-DREF_SLACK={self.ref_slack:.1f}f",
                f"-DL2_PREFETCH={self.l2_prefetch}", f"-DPARTIAL_F16={int(self.partial_fp16)}")

    @property
    def dynamic_smem(self) -> int:
        """Bytes of dynamic shared memory: ``stages`` ring stages of ``CHUNK`` rows and the score exchange."""
        lay = source_layout()
        return self.stages * lay["CHUNK"] * lay["PITCH"] + lay["XCHG_BYTES"]


DEFAULT = CudaFewHeadConfig()


@functools.cache
def _source() -> str:
    return resources.files(__package__).joinpath("fewhead_fp8.cu").read_text()


@functools.cache
def source_layout() -> dict[str, int]:
    """The ``.cu`` file's ``CHUNK`` (rows per step), ``PITCH`` (ring bytes per row) and ``XCHG_BYTES`` (score
    exchange), read from its ``#define`` lines (a number or a product of numbers), so shared memory is sized from
    the one definition."""
    defines = dict(re.findall(r"^#define (CHUNK|PITCH|XCHG_BYTES) \(?([\d *]+?)\)?\s*(?://|$)", _source(), flags=re.M))
    if set(defines) != {"CHUNK", "PITCH", "XCHG_BYTES"}:
        raise RuntimeError(f"fewhead_fp8.cu: expected CHUNK, PITCH and XCHG_BYTES as products of numbers, got "
                           f"{defines}")
    return {name: math.prod(int(f) for f in value.split("*")) for name, value in defines.items()}


def supported(heads: int, d_v: int) -> bool:
    """Shapes this kernel takes (others go to the Triton kernels): 1 to 16 heads, or 32 (two groups of 16)."""
    fits = 1 <= heads <= GROUP_HEADS or (heads % GROUP_HEADS == 0 and 0 < heads <= MAX_HEADS)
    return fits and d_v == D_LATENT


def head_groups(heads: int) -> int:
    """CTAs per query and slice: one per group of :data:`GROUP_HEADS` heads (fewer heads: one)."""
    return max(heads // GROUP_HEADS, 1)


def use_cuda_kernel(q: Tensor, d_v: int) -> bool:
    """Whether a decode call with queries ``q`` (``[B, Q, H, 576]``) runs this kernel: a CUDA tensor, a
    :func:`supported` shape, and :func:`enabled` on its device."""
    if not (q.is_cuda and q.dim() == 4 and supported(q.shape[-2], d_v)):
        return False
    return enabled(q.device.index if q.device.index is not None else torch.cuda.current_device())


@functools.cache
def enabled(device_index: int) -> bool:
    """Whether the Triton backend sends ``fp8_656`` decode at the :func:`supported` head counts here: NVRTC found,
    an SM89+ device (``cvt.rn.f16x2.e4m3x2``), and :data:`ENV_SWITCH` not ``"0"``. Logged once per device when it
    is not."""
    return nvrtc.kernel_enabled("few-head fp8_656 decode", ENV_SWITCH, device_index, (8, 9), "the Triton kernel")


@functools.cache
def _kernel(cfg: CudaFewHeadConfig, device: torch.device) -> nvrtc.CudaKernel:
    return nvrtc.load_kernel(_source(), "fewhead_fp8_decode", cfg.options, cfg.dynamic_smem, device)


def decode_fewhead_fp8_cuda(q: Tensor, kv_cache: Tensor, indices: Tensor, sm_scale: float, d_v: int = D_LATENT,
                            *, config: CudaFewHeadConfig | None = None) -> tuple[Tensor, Tensor]:
    """Sparse MLA decode, ``fp8_656`` cache, up to 16 heads, or 32 as two groups of 16 (each group's CTA reads the
    same rows side by side with the other's, the second read mostly from the L2).

    Args:
        q: ``[B, Q, H, 576]`` bf16, ``1 <= H <= 16`` or ``H == 32``, last dim contiguous.
        kv_cache: ``[pages, page_size, 656]`` uint8; slot = page * page_size + offset.
        indices: ``[B, Q, K]`` int32 slots, ``-1`` = empty (never read).
        sm_scale: softmax scale. d_v: must be 512.
    Returns:
        ``out`` ``[B, Q, H, 512]`` bf16 and ``lse`` ``[B, Q, H]`` fp32 (natural log; ``+inf`` with no valid slot).
    """
    if kv_cache.dim() != 3 or kv_cache.shape[-1] != FP8_MLA_ROW_BYTES or kv_cache.dtype != torch.uint8:
        raise ValueError(f"fp8_656 cache must be [pages, page_size, 656] uint8, got {tuple(kv_cache.shape)} "
                         f"{kv_cache.dtype}")
    batch, n_q, heads, _ = q.shape
    if not supported(heads, d_v):
        raise ValueError(f"the CUDA few-head kernel takes 1..{GROUP_HEADS} or {MAX_HEADS} heads and d_v 512, got "
                         f"{heads}, {d_v}")
    if q.dtype != torch.bfloat16:
        raise ValueError(f"q must be bf16, got {q.dtype}")
    cfg = config or DEFAULT
    return launch_fewhead_kernel(_kernel(cfg, q.device), THREADS, source_layout()["CHUNK"], q, kv_cache, indices,
                                 sm_scale, splits=cfg.splits, min_rows=cfg.min_rows, partial_fp16=cfg.partial_fp16,
                                 pdl_merge=cfg.pdl_merge, pdl_main=cfg.pdl_main)


def launch_fewhead_kernel(kern: nvrtc.CudaKernel, threads: int, chunk: int, q: Tensor, kv_cache: Tensor,
                          indices: Tensor, sm_scale: float, *, splits: int = 0, min_rows: int = 128,
                          partial_fp16: bool = True, pdl_merge: bool = True, pdl_main: bool = False,
                          merge: bool = True) -> tuple[Tensor, Tensor]:
    """Plan, launch and merge a few-head ``fp8_656`` decode kernel with ``fewhead_fp8.cu``'s argument list (its
    ``chunk``-row slices, groups of 16 heads, partials and their scales); the probes in ``bench/`` share it.

    ``q``, ``kv_cache``, ``indices``: as :func:`decode_fewhead_fp8_cuda` (checked there). ``splits`` / ``min_rows``:
    the slice plan (:func:`..triton.fewhead_plan.plan_splits`); ``partial_fp16``: the kernel's partial format;
    ``pdl_main``: launch the kernel as a programmatic dependent (it must wait, ``griddepcontrol.wait``, before its
    first memory access, as ``fewhead_fp8.cu`` does); ``merge=False`` leaves the slices unmerged (a bench's way to
    time the launch alone: the output is then wrong).
    """
    batch, n_q, heads, _ = q.shape
    d_v = D_LATENT
    qf, idx = flatten_decode_inputs(q, indices)  # unit-stride q columns, int32 indices
    if qf.stride(1) % 8 or qf.stride(0) % 8 or qf.data_ptr() % 16:  # the kernel reads q 16 bytes at a time
        qf = qf.contiguous()
    top_k = idx.shape[1]
    mq = batch * n_q
    out = torch.empty(mq, heads, d_v, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(mq, heads, dtype=torch.float32, device=q.device)
    if mq == 0:
        return out.reshape(batch, n_q, heads, d_v), lse.reshape(batch, n_q, heads)
    rows = kv_cache.contiguous()
    groups = head_groups(heads)
    g_heads, mg = heads // groups, mq * groups  # each (query, head group) is an output row of g_heads heads
    plan = FewHeadConfig(block_n=chunk, splits=splits, min_rows=min_rows)
    splits = plan_splits(mg, top_k, sm_count(q.device), kern.resident_blocks(threads), plan)
    splits, per_split = slice_rows(top_k, splits, chunk)
    if splits > 1:
        part = torch.empty(mg, splits, g_heads, D_LATENT, dtype=torch.float16 if partial_fp16 else torch.float32,
                           device=q.device)
        plse = torch.empty(mg, splits, g_heads, dtype=torch.float32, device=q.device)
        # one scale per slice and 128-column block with fp16 partials
        pscale = torch.empty(mg, splits, D_LATENT // 128, dtype=torch.float32, device=q.device) \
            if partial_fp16 else None
    else:
        part = plse = lse  # unread with one slice
        pscale = None
    scale_arg = plse if pscale is None else pscale  # (unwritten without fp16 partials)
    ptr = ctypes.c_void_p
    kern.launch((splits * groups, mq, 1), (threads, 1, 1), [
        ptr(qf.data_ptr()), ptr(rows.data_ptr()), ptr(idx.data_ptr()), ptr(part.data_ptr()), ptr(plse.data_ptr()),
        ptr(scale_arg.data_ptr()), ptr(out.data_ptr()), ptr(lse.data_ptr()), ctypes.c_int(g_heads), ctypes.c_int(top_k),
        ctypes.c_int(per_split), ctypes.c_int(splits), ctypes.c_float(float(sm_scale) * LOG2E),
        ctypes.c_longlong(qf.stride(0)), ctypes.c_longlong(qf.stride(1)), ctypes.c_longlong(idx.stride(0)),
        ctypes.c_int(groups)], pdl=pdl_enabled(pdl_main, q.device))
    if splits > 1 and merge:  # enough merge programs to cover the GPU four times
        merge_slices(part, plse, out.view(mg, g_heads, d_v), lse.view(mg, g_heads), d_v,
                     min_programs=4 * sm_count(q.device), pdl=pdl_enabled(pdl_merge, q.device),
                     part_scale=pscale)
    return out.reshape(batch, n_q, heads, d_v), lse.reshape(batch, n_q, heads)
