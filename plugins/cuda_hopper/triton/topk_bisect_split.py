"""Exact top-k over several programs per row: each slice's own top-k, then one merge (Triton).

A few rows leave most SMs idle under :mod:`.topk_bisect` (one program per row), and rows longer than 32K do
not fit one program's registers. Here a row's window is cut into ``S`` slices of at most 32K columns; program
``(r, j)`` selects slice ``j``'s top-k exactly as :mod:`.topk_bisect` does (one read into registers, the
bit-by-bit search) and writes its keys and absolute columns to a ``[R, S, k]`` candidate buffer (``INT_MIN``
keys pad a short slice). One program per row then selects the top-k of the row's ``S * k`` candidates.

Why it is exact: every key of the row's top-k is in its own slice's top-k (the same total order: larger key
first, then the lower column), so the candidates hold the whole answer. Ties at the row's threshold go to the
lower column: each slice lists the keys equal to any given value in column order, and slices come in column
order, so the merge's candidate order breaks ties as the row's column order does. Output order is fixed for a
given input (keys above the threshold, then the threshold's ties, each in candidate order): deterministic.
Buffers are sized by shapes only and nothing syncs with the host (CUDA-graph capturable).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsa_runtime.plugins.cuda_hopper.triton.pdl import grid_sync, pdl_kwargs
from dsa_runtime.plugins.cuda_hopper.triton.topk import BISECT_MAX_WIDTH as MAX_WIDTH
from dsa_runtime.plugins.cuda_hopper.triton.topk_bisect import (
    bisect_warps,
    bisect_width,
    fill_tail,
    rank_selected,
    row_wanted,
    threshold,
)
from dsa_runtime.plugins.cuda_hopper.triton.topk_radix import radix_key, table_args, to_slots

INT_MIN = tl.constexpr(-2147483648)


def _slices(rows: int, width: int, k: int, sms: int, most: int) -> int:
    """The fewest slices of at most :data:`MAX_WIDTH` columns, doubled (up to ``most``) while the rows leave SMs
    idle and each slice stays at least ``max(2k, 4096)`` wide."""
    s = 1
    while s * MAX_WIDTH < width:
        s *= 2
    while rows * s * 2 <= sms and width // (s * 2) >= max(2 * k, 4096) and s * 2 <= most:
        s *= 2
    return s


def bisect_split_for(rows: int, width: int, k: int, sms: int, merge_max: int = 8192) -> int:
    """Slices per row: enough for slices of at most :data:`MAX_WIDTH` columns, then doubled while the rows
    leave SMs idle and each slice stays at least ``max(2k, 4096)`` wide; 1 when one program per row is best.
    0 (another search must take the row) when the candidates of the slices a row needs (``S * k``) exceed
    ``merge_max``, or when long rows cut into 32K slices would still leave half the SMs idle (1 x 128K: the
    candidate search's 16 programs per row win there, 0.054 vs 0.082 ms on the H200)."""
    fewest = -(-width // MAX_WIDTH)
    if fewest > 1 and rows * (1 << (fewest - 1).bit_length()) < sms // 2:
        return 0
    s = _slices(rows, width, k, sms, merge_max // k)
    if s > 1 and s * k > merge_max:
        return 0
    return s


def bisect_plan(rows: int, width: int, k: int, sms: int, merge_max: int = 8192,
                two_level: bool = False) -> tuple[int, int]:
    """``(slices, groups)``: :func:`bisect_split_for`'s one-level split (groups 1), or with ``two_level`` for few
    long rows it turns down, up to ``(merge_max / k)**2`` slices of at least ``max(2k, 4096)`` columns merged
    in groups of at most ``merge_max / k`` slices, then once more over the groups; ``(0, 1)``: neither fits."""
    s = bisect_split_for(rows, width, k, sms, merge_max)
    per = merge_max // k
    if s != 0 or not two_level or per < 2:
        return s, 1
    s = _slices(rows, width, k, sms, per * per)
    g = 1
    while s // g > per:
        g *= 2
    if s > per * per or g > per:
        return 0, 1
    return s, g


@triton.jit
def _slice_kernel(
    logits_ptr, stride_row, starts_ptr, ends_ptr, ckey_ptr, ccol_ptr, k, S, SLICE, skip_ptr,
    WIDTH: tl.constexpr, BLOCK: tl.constexpr, HAS_SKIP: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """Program ``(r, j)``: the top-k of columns ``[lo + j * SLICE, min(hi, lo + (j + 1) * SLICE))`` as keys and
    absolute columns in ``[r, j, :]`` (``INT_MIN`` keys past the slice's own count). ``HAS_SKIP``: a row with
    ``skip_ptr[r] != 0`` is left alone (its candidates are never read)."""
    grid_sync(PDL)
    r = tl.program_id(0)
    j = tl.program_id(1)
    if row_wanted(skip_ptr, r, HAS_SKIP):
        _slice_row(logits_ptr, stride_row, starts_ptr, ends_ptr, ckey_ptr, ccol_ptr, k, S, SLICE, r, j, WIDTH, BLOCK)


@triton.jit
def _slice_row(logits_ptr, stride_row, starts_ptr, ends_ptr, ckey_ptr, ccol_ptr, k, S, SLICE, r, j,
               WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    """Program ``(r, j)`` of :func:`_slice_kernel`."""
    lo = tl.load(starts_ptr + r).to(tl.int32)
    hi = tl.load(ends_ptr + r).to(tl.int32)
    a = lo + j * SLICE
    b = tl.minimum(hi, a + SLICE)
    n = tl.maximum(b - a, 0)
    cols = a + tl.arange(0, WIDTH)
    inside = cols < b
    x = tl.load(logits_ptr + r.to(tl.int64) * stride_row + cols, mask=inside, other=0.0)
    key = tl.where(inside, radix_key(x), INT_MIN)
    thr, take_all, need = threshold(key, n, k)
    dest, sel = rank_selected(key, thr, take_all, need)
    base = (r.to(tl.int64) * S + j) * k
    tl.store(ckey_ptr + base + dest, key, mask=sel)
    tl.store(ccol_ptr + base + dest, cols, mask=sel)
    fill_tail(ckey_ptr + base, tl.minimum(n, k), k, INT_MIN, BLOCK)


@triton.jit
def _merge_kernel(
    ckey_ptr, ccol_ptr, starts_ptr, out_ptr, k, SK,
    table_ptr, stride_table, batch_ptr, page_size, skip_ptr, skip_div,
    WIDTH: tl.constexpr, BLOCK: tl.constexpr, FUSE: tl.constexpr, OUT_CAND: tl.constexpr = False,
    HAS_SKIP: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """Program ``r``: the top-k of the row's ``SK = S * k`` candidates -> ``[k]`` row-relative positions (slots
    when ``FUSE``), ``-1`` padded. ``OUT_CAND`` (a first merge level, ``r`` a group of slices): the selected keys
    and absolute columns instead, to ``out_ptr`` / ``table_ptr`` ``[r, k]`` (``INT_MIN`` keys padding), which
    keeps equal keys in column order for the next level. ``HAS_SKIP``: nothing is written for a row (``r //
    skip_div``) with ``skip_ptr`` non-zero."""
    grid_sync(PDL)
    r = tl.program_id(0)
    if row_wanted(skip_ptr, r // skip_div, HAS_SKIP):
        _merge_row(ckey_ptr, ccol_ptr, starts_ptr, out_ptr, k, SK, table_ptr, stride_table, batch_ptr, page_size, r,
                   WIDTH, BLOCK, FUSE, OUT_CAND)


@triton.jit
def _merge_row(ckey_ptr, ccol_ptr, starts_ptr, out_ptr, k, SK, table_ptr, stride_table, batch_ptr, page_size, r,
               WIDTH: tl.constexpr, BLOCK: tl.constexpr, FUSE: tl.constexpr, OUT_CAND: tl.constexpr):
    """Program ``r`` of :func:`_merge_kernel`."""
    out_row = out_ptr + r.to(tl.int64) * k
    offs = tl.arange(0, WIDTH)
    inside = offs < SK
    base = r.to(tl.int64) * SK
    key = tl.load(ckey_ptr + base + offs, mask=inside, other=INT_MIN)
    n = tl.sum((key != INT_MIN).to(tl.int32), 0)
    thr, take_all, need = threshold(key, n, k)
    dest, sel = rank_selected(key, thr, take_all, need)
    if OUT_CAND:
        col_row = table_ptr + r.to(tl.int64) * k
        tl.store(out_row + dest, key, mask=sel)
        tl.store(col_row + dest, tl.load(ccol_ptr + base + offs, mask=sel, other=0), mask=sel)
        fill_tail(out_row, tl.minimum(n, k), k, INT_MIN, BLOCK)
    else:
        lo = tl.load(starts_ptr + r).to(tl.int32)
        val = tl.load(ccol_ptr + base + offs, mask=sel, other=0) - lo
        if FUSE:
            table_row = table_ptr + tl.load(batch_ptr + r).to(tl.int64) * stride_table
            val = to_slots(val, table_row, page_size, sel)
        tl.store(out_row + dest, val, mask=sel)
        fill_tail(out_row, tl.minimum(n, k), k, -1, BLOCK)


def launch_bisect_split(logits, starts, ends, out, k, table, batch, page_size, *, split: int, groups: int = 1,
                        keys_per_thread: int = 0, block: int = 1024, skip=None, pdl: bool = False) -> None:
    """``split`` programs per row, then the merge: one program per row (two launches), or with ``groups > 1``
    first one program per group of ``split / groups`` consecutive slices, then one per row over the groups'
    candidates (three launches; for few long rows whose ``split * k`` candidates one program cannot hold).
    ``skip`` (int32 ``[R]``, optional): rows marked non-zero are already written and left alone. ``pdl``: every
    launch is a programmatic dependent launch (:mod:`.pdl`; the caller checks the device supports it)."""
    rows, width = logits.shape
    slice_w = -(-width // split)
    if groups < 1 or split % groups:
        raise ValueError(f"groups {groups} must divide the slices {split}")
    if slice_w > MAX_WIDTH or (split // groups) * k > MAX_WIDTH or groups * k > MAX_WIDTH:
        raise ValueError(f"{split} slices of {width} columns in {groups} groups with k = {k} do not fit one program each")
    dev = logits.device
    sk = starts if skip is None else skip
    cand = torch.empty((2, rows, split, k), dtype=torch.int32, device=dev)  # keys, absolute columns
    w1 = bisect_width(slice_w)
    _slice_kernel[(rows, split)](
        logits, logits.stride(0), starts, ends, cand[0], cand[1], k, split, slice_w, sk,
        WIDTH=w1, BLOCK=min(block, w1), HAS_SKIP=skip is not None, PDL=pdl,
        num_warps=bisect_warps(w1, keys_per_thread), **pdl_kwargs(pdl),
    )
    if groups > 1:
        per = split // groups
        merged = torch.empty((2, rows, groups, k), dtype=torch.int32, device=dev)
        wg = bisect_width(per * k)
        _merge_kernel[(rows * groups,)](
            cand[0], cand[1], starts, merged[0], k, per * k, merged[1], 0, starts, 1, sk, groups,
            WIDTH=wg, BLOCK=min(block, wg), FUSE=False, OUT_CAND=True, HAS_SKIP=skip is not None, PDL=pdl,
            num_warps=bisect_warps(wg, keys_per_thread), **pdl_kwargs(pdl),
        )
        cand, split = merged, groups
    table, stride_table, batch, page_size, fuse = table_args(out, starts, table, batch, page_size)
    w2 = bisect_width(split * k)
    _merge_kernel[(rows,)](
        cand[0], cand[1], starts, out, k, split * k, table, stride_table, batch, page_size, sk, 1,
        WIDTH=w2, BLOCK=min(block, w2), FUSE=fuse, HAS_SKIP=skip is not None, PDL=pdl,
        num_warps=bisect_warps(w2, keys_per_thread), **pdl_kwargs(pdl),
    )
