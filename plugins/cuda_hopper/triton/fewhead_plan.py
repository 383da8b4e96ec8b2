"""Launch planning of the few-head sparse MLA decode (:mod:`.sparse_mla_decode_fewhead`): its configurations,
the measured defaults by layout and head tile, and how many slices each query's selected rows take.

Slices are planned from the compiled kernel's residency (registers and shared memory: how many programs one SM
holds, :func:`resident_programs`) so that one wave covers the GPU and never spills into a second
(:func:`plan_splits`). Nothing here launches a kernel; the residency is cached per device, kernel and
constexprs, and read before anything is built, so a warm eager decode step allocates nothing to plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton

from dsa_runtime.plugins.cuda_hopper.triton.moe_quant import INTERPRET


@dataclass(frozen=True)
class FewHeadConfig:
    """Launch shape: rows per step, warps, pipeline stages, the kernel (``cols``: four 128-column blocks;
    ``fold``: ``cols`` with ``fp8_656`` scales folded into scores and fp16 probabilities), fixed splits (0 = planned from the kernel's residency), fewest rows per slice, and whether
    slices merge in the same launch (ticket counters) rather than in a second one."""

    block_n: int = 32
    num_warps: int = 4
    num_stages: int = 3
    variant: str = "cols"
    splits: int = 0
    min_rows: int = 128
    fused: bool = False

    @property
    def label(self) -> str:
        fixed = f"_x{self.splits}" if self.splits else ""
        return f"{self.variant}_n{self.block_n}_w{self.num_warps}_s{self.num_stages}{fixed}" + (
            "_fused" if self.fused else "")


DEFAULT = FewHeadConfig()
VARIANTS = ("cols", "fold")
# By (layout, head tile), the fastest of bench/fewhead_decode.py --sweep / --merge on an H200 (2026-11-26, k 2048,
# docs/benchmarks.md). At 16 heads, batch 64: fp8_656 fold 0.089 ms (cols 0.093, the head-blocked kernel 0.139);
# bf16 cols in 64-row steps 0.059 (head-blocked 0.068); at 32 heads fp8_656 cols 0.110, bf16 cols 0.078. Slices
# are merged by a second launch: at batch 64 it ties the in-launch merge (0.089 vs 0.091), at batch 1 it wins
# (0.027 vs 0.038 ms), and at 32 heads (0.110 vs 0.122) one program merging 32 heads x 512 fp32 per slice was the
# tail.
DEFAULTS: dict[tuple[str, int], FewHeadConfig] = {
    ("fp8_656", 16): FewHeadConfig(32, 4, 3, "fold", fused=False),
    ("fp8_656", 32): FewHeadConfig(32, 4, 3, "cols", fused=False),
    ("bf16", 16): FewHeadConfig(64, 4, 3, "cols", fused=False),
    ("bf16", 32): FewHeadConfig(64, 4, 3, "cols", fused=False),
}


def default_config(layout: str, heads: int) -> FewHeadConfig:
    """:data:`DEFAULTS` for the head tile of ``heads`` (16 up to 16 heads, else 32; 64 heads take the 32 entry)."""
    return DEFAULTS[(layout, 16 if heads <= 16 else 32)]


def plan_splits(queries: int, top_k: int, sms: int, resident: int, cfg: FewHeadConfig = DEFAULT) -> int:
    """Slices of each query's ``top_k`` rows: as many as one wave holds (``resident`` programs per SM, from the
    compiled kernel), each at least ``min_rows`` rows (its fp32 partial costs ``H x 2 KB`` to write and read
    back), at most 64. A second wave costs a whole program's time, so slices never spill into one."""
    if cfg.splits:
        return max(1, min(cfg.splits, triton.cdiv(max(top_k, 1), cfg.block_n)))
    if queries == 0 or top_k <= cfg.min_rows:
        return 1
    return max(1, min(sms * resident // queries, triton.cdiv(top_k, cfg.min_rows), 64))


def slice_rows(top_k: int, splits: int, block_n: int) -> tuple[int, int]:
    """``(splits, rows_per_split)`` for ``splits`` planned slices of ``top_k`` rows: each slice rounded up to whole
    ``block_n``-row blocks, then only as many slices as those cover (no slice left without rows)."""
    per_split = triton.cdiv(triton.cdiv(max(top_k, 1), splits), block_n) * block_n
    return triton.cdiv(max(top_k, 1), per_split), per_split


_RESIDENT: dict[tuple, int] = {}


def resident_programs(kernel, make_args: Callable[[], tuple], constexprs: dict, device: torch.device) -> int:
    """Programs of ``kernel`` one SM holds at once, from its compiled registers and shared memory; 4 under the
    interpreter. Looked up by (device, kernel, constexprs) before anything else: only the first call of a key
    runs ``make_args()`` (the launch's arguments, a probe workspace among them) and compiles (host only: safe
    while a graph captures), so a warm eager decode step allocates nothing here."""
    if INTERPRET or device.type != "cuda":
        return 4
    key = (device.index, kernel.fn.__name__ if hasattr(kernel, "fn") else id(kernel), tuple(sorted(constexprs.items())))
    resident = _RESIDENT.get(key)
    if resident is not None:
        return resident
    compiled = kernel.warmup(*make_args(), grid=(1,), **constexprs)
    compiled = compiled.result() if hasattr(compiled, "result") else compiled
    compiled._init_handles()
    props = torch.cuda.get_device_properties(device)
    threads = 32 * constexprs["num_warps"]
    regs = max(1, compiled.n_regs) * threads
    regs = -(-regs // 2048) * 2048  # per-warp allocation granularity, rounded up per block
    smem = compiled.metadata.shared + 1024  # the driver's reserved shared memory per block
    by_regs = props.regs_per_multiprocessor // regs
    by_smem = props.shared_memory_per_multiprocessor // smem
    by_threads = props.max_threads_per_multi_processor // threads
    resident = _RESIDENT[key] = max(1, min(by_regs, by_smem, by_threads, 32))
    return resident
