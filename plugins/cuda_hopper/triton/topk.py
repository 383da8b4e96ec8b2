"""The ``topk`` family of the ``triton`` backend: exact windowed top-k by radix select, and the slot transform.

:meth:`TritonTopK.topk` and :meth:`TritonTopK.topk_transform` run the register-resident bit-by-bit search of
:mod:`.topk_bisect` (one read of the row, data-independent cost) for rows of up to 32K columns, and for longer or
few rows its sliced form with one or two merge levels (:mod:`.topk_bisect_split`). Rows over 32K columns first
take the sampled-bound search of :mod:`.topk_sample` (a sample bounds the k-th key from below, one scan keeps
the ~k keys above the bound, one program per row searches those); the register search then takes only the rows
it missed (ties or ``-inf`` floods at the bound), skipping the rest on the device. Rows that fit neither take
the candidate-buffer search of :mod:`.topk_cand` (two full-row passes, then radix passes over the threshold bin's few columns; one kernel
for many rows, four launches with several programs per row for few long rows). ``candidates=False`` (or
``bits=11``) selects the full radix search of :mod:`.topk_radix` (one program per row) and :mod:`.topk_split`
(several programs per row, a fixed handful of launches). Nothing synchronises with the host and every buffer is sized
from shapes, so the calls are CUDA-graph capturable. Results are deterministic and identical to the
reference's selection (ties at the cut go to the lower column). Window bounds are trusted (checking them
would read the device): ``0 <= start <= end <= L`` is the caller's contract.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from dsa_runtime.capabilities import MethodClaim, ValueSet

if TYPE_CHECKING:  # torch is imported on first use: the plugin reads TOPK_CLAIMS at registration
    import torch
    from torch import Tensor

MAX_K = 16384
BISECT_MAX_WIDTH = 32768  # rows up to this many columns fit one program's registers (:mod:`.topk_bisect`)

# k is any value in [1, MAX_K] (2048 for V3.2); page sizes and devices are not restricted.
TOPK_CLAIMS: dict[str, MethodClaim] = {
    "topk.topk": MethodClaim(k=ValueSet.between(1, MAX_K)),
    "topk.page_table_transform": MethodClaim(k=ValueSet.between(1, MAX_K)),
    "topk.topk_transform": MethodClaim(k=ValueSet.between(1, MAX_K)),
}


@dataclass(frozen=True)
class SamplePlan:
    """Launch shape of the sampled-bound search of :mod:`.topk_sample`.

    Attributes:
        slices: scan programs per row (0: :func:`.topk_sample.sample_slices` picks, about four programs per SM,
            eight for the CUDA scan).
        cap: most candidates per row (a power of two; the finish holds them in registers).
        sample: sampled keys per row (a power of two).
        chunk: columns per sampled run (a power of two dividing ``sample``; 32 fp32 = one 128-byte line).
        sigmas: margin of the sampled rank over its expectation, in standard deviations.
        fused_sample: every scan program finds the bound itself from the same sample (one launch fewer).
        block: columns per chunk of the scan.
        stages: chunks the scan has in flight (``tl.range`` stages: 2 and up copy the next chunks to shared
            memory asynchronously while the current one is compared and compacted).
        warps: warps of the scan programs.
        sample_warps: warps of the sample program (or of the scan programs when fused, if more).
        finish_warps: warps of the finish.
        pdl: the sampled search and its fallback launch as programmatic dependent launches (Hopper and later,
            :mod:`.pdl`: each kernel is scheduled while the previous one drains; H200, 2026-11-26: 1 x 128K
            0.039 against 0.042-0.043 ms, no change at 64 or 256 rows).
        cuda_scan: the scan runs as CUDA C++ (:mod:`...cuda.topk_scan`, same buffers) where NVRTC is found and
            the logits' alignment allows; else (and with ``DSA_TOPK_SCAN_CUDA=0``) the Triton scan. Only the
            Triton scan runs ``fused_sample`` and ``stages``.
        cuda_round: the CUDA scan's 1024-column steps per round (16-byte loads a thread has in flight, doubled by
            the next round's prefetch).
        cuda_threads: threads of a CUDA scan program (4 columns each per step).
    """

    slices: int = 0
    cap: int = 4096
    sample: int = 8192
    chunk: int = 32
    sigmas: float = 4.0
    fused_sample: bool = False
    block: int = 2048
    stages: int = 1
    warps: int = 4
    sample_warps: int = 8
    finish_warps: int = 8
    pdl: bool = True
    cuda_scan: bool = True
    cuda_round: int = 2
    cuda_threads: int = 256


@dataclass(frozen=True)
class TopKConfig:
    """Launch shape.

    Attributes:
        bits: radix bits per pass (8: 4 passes of 256 bins; 11: 3 passes of 2048 bins, random rows usually
            done after 2; 2048-bin histograms are slow on the GPU: 8 is the default).
        block: columns per chunk of a program.
        warps: warps per program.
        split: programs per row (0: choose by :func:`split_for`; 1: one program per row).
        split_block: columns per chunk in the split kernels.
        split_warps: warps per program of the split kernels.
        min_slice: least columns per program when splitting (bounds the split count of short rows).
        candidates: with ``bits == 8``, the two-pass candidate-buffer search of :mod:`.topk_cand` (falls back
            to the full search per row, on the device, when the threshold bin overflows the buffer).
        cand_cap: candidate-buffer columns per row, one program per row (capped at ``L``).
        split_cand_cap: the same when rows are split (capped at ``L``).
        finish_block: columns per chunk of the per-row finish over the candidates (split rows).
        finish_warps: warps of that finish kernel.
        bisect: rows of at most :data:`BISECT_MAX_WIDTH` columns are read once into registers and searched bit by
            bit (:mod:`.topk_bisect`); longer rows take the paths above.
        bisect_keys_per_thread: keys each thread holds there (sets the warps); 0: 32 up to 8K columns, 64 above
            (the faster of the two at 4096 x 8K and 64 x 32K on the H200, 2026-11-23).
        bisect_block: columns per chunk of its final write pass.
        bisect_reg_write: that final pass as one scan over the keys held in registers (no second read; the
            default: 4096 x 8K 0.29 ms vs 0.38 ms for the chunked pass over memory on the H200).
        bisect_split: slices per row for :mod:`.topk_bisect_split` (each slice's top-k, then a merge): 0 chooses
            (:func:`.topk_bisect_split.bisect_split_for`: few rows spread over the SMs, rows over 32K cut into
            32K slices), 1 never splits.
        bisect_merge_max: most candidates (slices x k) one merge program takes; rows needing more take the
            radix paths, or with ``bisect_two_level`` a merge in groups of slices, then over the groups.
        bisect_two_level: few long rows (1 x 128K) too take the register search, in 16 slices merged in two
            levels: cost independent of ties and ``-inf`` floods, which push the candidate search into its full-row
            fallback (H200, 1 x 128K, graph: random 0.051 vs 0.054 ms, tied 0.057 vs 0.114, 1000 finite logits
            0.057 vs 0.869).
        sample: rows of at least ``sample_min_width`` columns first take the sampled-bound search of
            :mod:`.topk_sample` with this launch shape (one read of the row, then a search over about ``k``
            candidates), when the register search is the fallback for the rows it misses (``2 k <=
            sample.cap``); None: never.
        sample_min_width: the narrowest rows that take it (narrower ones fit the register search whole).
    """

    bits: int = 8
    block: int = 2048
    warps: int = 8
    split: int = 0
    split_block: int = 2048
    split_warps: int = 8
    min_slice: int = 8192
    candidates: bool = True
    cand_cap: int = 4096
    split_cand_cap: int = 65536
    finish_block: int = 1024
    finish_warps: int = 4
    bisect: bool = True
    bisect_keys_per_thread: int = 0
    bisect_block: int = 1024
    bisect_reg_write: bool = True
    bisect_split: int = 0
    bisect_merge_max: int = 8192
    bisect_two_level: bool = True
    sample: SamplePlan | None = field(default_factory=SamplePlan)
    sample_min_width: int = BISECT_MAX_WIDTH + 1


def split_for(rows: int, width: int, cfg: TopKConfig, sms: int = 132) -> int:
    """Programs per row: 1 when the rows alone fill the GPU, else enough to give every SM a slice of at least
    ``cfg.min_slice`` columns (a power of two, at most 64)."""
    if cfg.split:
        return cfg.split
    if rows >= sms or width < 2 * cfg.min_slice:
        return 1
    want = min(-(-sms // max(rows, 1)), width // cfg.min_slice, 64)
    return 1 << max(0, (want.bit_length() - 1))


def _sms(device: torch.device) -> int:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


class TritonTopK:
    """:class:`dsa_runtime.families.TopKKernels` in Triton (radix select)."""

    def __init__(self, config: TopKConfig | None = None) -> None:
        self.config = config or TopKConfig()

    def _select(
        self, logits: Tensor, row_starts: Tensor, row_ends: Tensor, k: int,
        table: Tensor | None, batch: Tensor | None, page_size: int,
    ) -> Tensor:
        import torch

        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        if logits.dim() != 2:
            raise ValueError(f"logits must be [R, L], got shape {tuple(logits.shape)}")
        rows, width = logits.shape
        if row_starts.shape != (rows,) or row_ends.shape != (rows,):
            raise ValueError(f"row_starts/row_ends must be [{rows}], got {tuple(row_starts.shape)}/{tuple(row_ends.shape)}")
        dev = logits.device
        out = torch.empty((rows, k), dtype=torch.int32, device=dev)
        if rows == 0:
            return out
        x = logits if logits.dtype == torch.float32 else logits.float()
        if width and x.stride(1) != 1:
            x = x.contiguous()
        starts = row_starts.to(device=dev, dtype=torch.int32).contiguous()
        ends = row_ends.to(device=dev, dtype=torch.int32).contiguous()
        if table is not None:
            if page_size <= 0:
                raise ValueError(f"page_size must be positive, got {page_size}")
            table = table.to(device=dev, dtype=torch.int32).contiguous()
            batch = batch.to(device=dev, dtype=torch.int32).contiguous()  # type: ignore[union-attr]
        cfg = self.config
        if cfg.bisect:
            from dsa_runtime.plugins.cuda_hopper.triton.topk_bisect_split import bisect_plan

            split, groups = (cfg.bisect_split, 1) if cfg.bisect_split else bisect_plan(
                rows, width, k, _sms(dev), cfg.bisect_merge_max, cfg.bisect_two_level)
            one = split == 1 and width <= BISECT_MAX_WIDTH
            sliced = split > 1 and (split // groups) * k <= BISECT_MAX_WIDTH and -(-width // split) <= BISECT_MAX_WIDTH
            skip = None
            pdl = False
            plan = cfg.sample
            if (one or sliced) and plan is not None and width >= cfg.sample_min_width and 2 * k <= plan.cap:
                from dsa_runtime.plugins.cuda_hopper.triton.pdl import pdl_enabled

                skip = self._sample(x, starts, ends, out, k, table, batch, page_size)
                pdl = pdl_enabled(plan.pdl, dev)
            if one:
                from dsa_runtime.plugins.cuda_hopper.triton.topk_bisect import launch_bisect

                launch_bisect(x, starts, ends, out, k, table, batch, page_size, block=cfg.bisect_block,
                              keys_per_thread=cfg.bisect_keys_per_thread, reg_write=cfg.bisect_reg_write, skip=skip,
                              pdl=pdl)
                return out
            if sliced:
                from dsa_runtime.plugins.cuda_hopper.triton.topk_bisect_split import launch_bisect_split

                launch_bisect_split(x, starts, ends, out, k, table, batch, page_size, split=split, groups=groups,
                                    keys_per_thread=cfg.bisect_keys_per_thread, block=cfg.bisect_block, skip=skip,
                                    pdl=pdl)
                return out
        split = split_for(rows, width, cfg, _sms(dev))
        if cfg.candidates and cfg.bits == 8:
            from dsa_runtime.plugins.cuda_hopper.triton.topk_cand import launch_cand_rows, launch_cand_split

            if split <= 1:
                launch_cand_rows(x, starts, ends, out, k, table, batch, page_size, cap=cfg.cand_cap,
                                 block=cfg.block, warps=cfg.warps)
            else:
                launch_cand_split(x, starts, ends, out, k, table, batch, page_size, split=split,
                                  cap=cfg.split_cand_cap, block=cfg.split_block, warps=cfg.split_warps,
                                  finish_block=cfg.finish_block, finish_warps=cfg.finish_warps)
        elif split <= 1:
            from dsa_runtime.plugins.cuda_hopper.triton.topk_radix import launch_rows

            launch_rows(x, starts, ends, out, k, table, batch, page_size, bits=cfg.bits, block=cfg.block, warps=cfg.warps)
        else:
            from dsa_runtime.plugins.cuda_hopper.triton.topk_split import launch_split

            launch_split(x, starts, ends, out, k, table, batch, page_size, split=split, cfg=cfg)
        return out

    def _sample(self, x: Tensor, starts: Tensor, ends: Tensor, out: Tensor, k: int, table: Tensor | None,
                batch: Tensor | None, page_size: int) -> Tensor:
        """The sampled-bound search (:mod:`.topk_sample`); returns the rows it wrote (int32 ``[R]``)."""
        from dsa_runtime.plugins.cuda_hopper.triton.topk_sample import (
            launch_sample,
            sample_slices,
            uses_cuda_scan,
        )

        plan = self.config.sample
        assert plan is not None
        cuda_scan = uses_cuda_scan(plan, x)
        if not plan.slices:
            per_sm = 8 if cuda_scan else 4  # the CUDA scan's programs are smaller
            plan = replace(plan, slices=sample_slices(x.shape[0], x.shape[1], _sms(x.device), per_sm=per_sm))
        return launch_sample(x, starts, ends, out, k, table, batch, page_size, plan=plan, cuda_scan=cuda_scan)

    def topk(self, logits: Tensor, row_starts: Tensor, row_ends: Tensor, k: int) -> Tensor:
        """``[R, k]`` int32 positions relative to each row start, ``-1`` padded (see the family contract)."""
        return self._select(logits, row_starts, row_ends, k, None, None, 1)

    def page_table_transform(
        self, topk_indices: Tensor, page_table: Tensor, row_to_batch: Tensor, page_size: int
    ) -> Tensor:
        """``slot = page_table[b, p // page_size] * page_size + p % page_size``; ``-1`` stays ``-1``."""
        from dsa_runtime.plugins.cuda_hopper.triton.topk_slots import launch_slots

        if topk_indices.dim() != 2 or row_to_batch.shape != (topk_indices.shape[0],):
            raise ValueError(
                f"topk_indices must be [R, k] and row_to_batch [R], got {tuple(topk_indices.shape)} / {tuple(row_to_batch.shape)}"
            )
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        return launch_slots(topk_indices, page_table, row_to_batch, page_size)

    def topk_transform(
        self,
        logits: Tensor,
        row_starts: Tensor,
        row_ends: Tensor,
        k: int,
        page_table: Tensor,
        row_to_batch: Tensor,
        page_size: int,
    ) -> Tensor:
        """Fused :meth:`topk` and :meth:`page_table_transform`: the selecting pass writes slots directly."""
        return self._select(logits, row_starts, row_ends, k, page_table, row_to_batch, page_size)
