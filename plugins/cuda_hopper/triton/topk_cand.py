"""Exact top-k with a candidate buffer: two passes over the row, then radix passes over a few candidates (Triton).

Pass 1 histograms the top byte (256 bins) of every key of the window (keys as in :mod:`.topk_radix`) and
finds the threshold bin ``b``: ``above`` keys lie in higher bins, ``m`` in ``b``. Pass 2 reads the row once
more and writes every key of a higher bin straight to the output (at ``[0, above)``, column order), and
appends the columns of bin ``b`` to a per-row candidate buffer (``[R, C]`` int32, column order: a per-chunk
``tl.cumsum`` plus a running offset, no atomics). The remaining three 8-bit radix passes and the final write
(candidates above the threshold at ``[above, k - need)``, ties by ascending column at ``[k - need, k)``) then
read only the ``m`` candidates, gathering their logits again. A row whose threshold bin holds more than ``C``
keys (heavy ties, ``-inf`` floods) takes the full multi-pass path instead; the kernel decides on the device
from the counts (no host sync), and nothing is written past ``C``. Selections are identical to
:func:`.topk_radix.select_row`'s (same output order too); windows of ``n <= k`` keys take the same
take-all path.

Two launch shapes: one program per row (many rows: one launch), and ``S`` programs per row for few long rows
(three launches: slice histograms; reduce + scatter; one program per row finishing over the candidates).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsa_runtime.plugins.cuda_hopper.triton.topk_radix import (
    pass_hist,
    pick_bin,
    radix_key,
    select_row,
    to_slots,
)


@triton.jit
def scatter_top(row_ptr, a, c, lo, b, n_gt, n_c, out_row, cand_row, table_row, page_size,
                BLOCK: tl.constexpr, FUSE: tl.constexpr):
    """Columns ``[a, c)``: keys whose top byte (unsigned domain) is above ``b`` go to ``out_row[n_gt + rank]``,
    those in bin ``b`` to ``cand_row[n_c + rank]`` (absolute columns), both in column order."""
    offs = tl.arange(0, BLOCK)
    for c0 in range(a, c, BLOCK):
        cols = c0 + offs
        inside = cols < c
        x = tl.load(row_ptr + cols, mask=inside, other=0.0)
        top = ((radix_key(x) ^ -2147483648) >> 24) & 255
        gt = inside & (top > b)
        cd = inside & (top == b)
        gt_rank = n_gt + tl.cumsum(gt.to(tl.int32), 0) - 1
        cd_rank = n_c + tl.cumsum(cd.to(tl.int32), 0) - 1
        val = cols - lo
        if FUSE:
            val = to_slots(val, table_row, page_size, gt)
        tl.store(out_row + gt_rank, val, mask=gt)
        tl.store(cand_row + cd_rank, cols, mask=cd)
        n_gt += tl.sum(gt.to(tl.int32), 0)
        n_c += tl.sum(cd.to(tl.int32), 0)


@triton.jit
def finish_candidates(row_ptr, cand_row, m, b, above, lo, k, out_row, table_row, page_size,
                      BLOCK: tl.constexpr, FUSE: tl.constexpr):
    """The ``m`` candidates (columns of top byte ``b``; ``above`` keys already written): radix passes over
    bytes 1..3, then the candidates above the threshold and the first ties by column."""
    offs = tl.arange(0, BLOCK)
    need = k - above
    prefix = b << 24  # unsigned-domain key with the digits found so far
    sh = tl.full([], 24, tl.int32)
    done = (m == need).to(tl.int32)
    for p in tl.static_range(1, 4):
        shift = 24 - 8 * p  # plain names: the compiler refuses re-binding a constexpr in an unrolled loop
        hi_shift = 32 - 8 * p
        hist = tl.zeros([256], dtype=tl.int32)
        end = tl.where(done != 0, 0, m)
        for c0 in range(0, end, BLOCK):
            i = c0 + offs
            inside = i < end
            col = tl.load(cand_row + i, mask=inside, other=0)
            v = radix_key(tl.load(row_ptr + col, mask=inside, other=0.0)) ^ -2147483648
            inside = inside & ((v >> hi_shift) == (prefix >> hi_shift))
            hist += tl.histogram((v >> shift) & 255, 256, mask=inside)
        bb, ab, in_bin = pick_bin(hist, tl.maximum(need, 1), 8)
        upd = done == 0
        new_need = need - ab
        prefix = tl.where(upd, prefix | (bb << shift), prefix)
        sh = tl.where(upd, shift, sh)
        need = tl.where(upd, new_need, need)
        done = tl.where(upd & (in_bin == new_need), 1, done)
    thr = (prefix ^ -2147483648) >> sh
    eq_base = k - need
    n_gt = above
    n_eq = tl.zeros([], dtype=tl.int32)
    for c0 in range(0, m, BLOCK):
        i = c0 + offs
        inside = i < m
        col = tl.load(cand_row + i, mask=inside, other=0)
        key = radix_key(tl.load(row_ptr + col, mask=inside, other=0.0)) >> sh
        gt = inside & (key > thr)
        eq = inside & (key == thr)
        gt_rank = n_gt + tl.cumsum(gt.to(tl.int32), 0) - 1
        eq_rank = n_eq + tl.cumsum(eq.to(tl.int32), 0) - 1
        eq = eq & (eq_rank < need)
        dest = tl.where(gt, gt_rank, eq_base + eq_rank)
        val = col - lo
        if FUSE:
            val = to_slots(val, table_row, page_size, gt | eq)
        tl.store(out_row + dest, val, mask=gt | eq)
        n_gt += tl.sum(gt.to(tl.int32), 0)
        n_eq += tl.sum(eq.to(tl.int32), 0)


@triton.jit
def _cand_rows_kernel(
    logits_ptr, stride_row, starts_ptr, ends_ptr, out_ptr, cand_ptr, k, C,
    table_ptr, stride_table, batch_ptr, page_size,
    BLOCK: tl.constexpr, FUSE: tl.constexpr,
):
    """One program per row: top-byte histogram, then the candidate path or (overflow, ``n <= k``) the full one."""
    r = tl.program_id(0)
    row_ptr = logits_ptr + r.to(tl.int64) * stride_row
    lo = tl.load(starts_ptr + r).to(tl.int32)
    hi = tl.load(ends_ptr + r).to(tl.int32)
    out_row = out_ptr + r.to(tl.int64) * k
    cand_row = cand_ptr + r.to(tl.int64) * C
    table_row = table_ptr
    if FUSE:
        table_row = table_ptr + tl.load(batch_ptr + r).to(tl.int64) * stride_table
    search = (hi - lo) > k
    hist = pass_hist(row_ptr, lo, hi, tl.zeros([], dtype=tl.int32), search, 0, 8, BLOCK)
    b, above, m = pick_bin(hist, k, 8)
    use_cand = search & (m <= C)
    if use_cand:
        zero = tl.zeros([], dtype=tl.int32)
        scatter_top(row_ptr, lo, hi, lo, b, zero, zero, out_row, cand_row, table_row, page_size, BLOCK, FUSE)
        tl.debug_barrier()  # the candidates were stored by other threads of this program
        finish_candidates(row_ptr, cand_row, m, b, above, lo, k, out_row, table_row, page_size, BLOCK, FUSE)
    else:
        select_row(row_ptr, lo, hi, k, out_row, table_row, page_size, 8, BLOCK, FUSE)


@triton.jit
def _row_bin(ws_ptr, r, s, S, k):
    """Reduce row ``r``'s slice histograms: ``(b, above, m, gt_before, c_before)`` (the last two: counts of the
    slices before ``s``, above and in bin ``b``)."""
    idx = tl.arange(0, 256)
    tot = tl.zeros([256], dtype=tl.int32)
    before = tl.zeros([256], dtype=tl.int32)
    base = ws_ptr + r.to(tl.int64) * S * 256
    for j in range(0, S):
        h = tl.load(base + j * 256 + idx)
        tot += h
        before += tl.where(j < s, h, 0)
    b, above, m = pick_bin(tot, k, 8)
    gt_before = tl.sum(tl.where(idx > b, before, 0), 0)
    c_before = tl.sum(tl.where(idx == b, before, 0), 0)
    return b, above, m, gt_before, c_before


@triton.jit
def _slice_of(starts_ptr, ends_ptr, r, s, S):
    lo = tl.load(starts_ptr + r).to(tl.int32)
    hi = tl.load(ends_ptr + r).to(tl.int32)
    per = (hi - lo + S - 1) // S
    a = tl.minimum(lo + s * per, hi)
    return lo, hi, a, tl.minimum(a + per, hi)


@triton.jit
def _cand_hist_kernel(logits_ptr, stride_row, starts_ptr, ends_ptr, ws_ptr, k, S, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    s = tl.program_id(1)
    lo, hi, a, c = _slice_of(starts_ptr, ends_ptr, r, s, S)
    row_ptr = logits_ptr + r.to(tl.int64) * stride_row
    hist = pass_hist(row_ptr, a, c, tl.zeros([], dtype=tl.int32), (hi - lo) > k, 0, 8, BLOCK)
    tl.store(ws_ptr + (r.to(tl.int64) * S + s) * 256 + tl.arange(0, 256), hist)


@triton.jit
def _cand_scatter_kernel(
    logits_ptr, stride_row, starts_ptr, ends_ptr, ws_ptr, out_ptr, cand_ptr, k, S, C,
    table_ptr, stride_table, batch_ptr, page_size,
    BLOCK: tl.constexpr, FUSE: tl.constexpr,
):
    r = tl.program_id(0)
    s = tl.program_id(1)
    lo, hi, a, c = _slice_of(starts_ptr, ends_ptr, r, s, S)
    row_ptr = logits_ptr + r.to(tl.int64) * stride_row
    out_row = out_ptr + r.to(tl.int64) * k
    table_row = table_ptr
    if FUSE:
        table_row = table_ptr + tl.load(batch_ptr + r).to(tl.int64) * stride_table
    b, above, m, gt_before, c_before = _row_bin(ws_ptr, r, s, S, k)
    if ((hi - lo) > k) & (m <= C):
        cand_row = cand_ptr + r.to(tl.int64) * C
        scatter_top(row_ptr, a, c, lo, b, gt_before, c_before, out_row, cand_row, table_row, page_size, BLOCK, FUSE)


@triton.jit
def _cand_finish_kernel(
    logits_ptr, stride_row, starts_ptr, ends_ptr, ws_ptr, out_ptr, cand_ptr, k, S, C,
    table_ptr, stride_table, batch_ptr, page_size,
    BLOCK: tl.constexpr, FUSE: tl.constexpr,
):
    r = tl.program_id(0)
    lo = tl.load(starts_ptr + r).to(tl.int32)
    hi = tl.load(ends_ptr + r).to(tl.int32)
    row_ptr = logits_ptr + r.to(tl.int64) * stride_row
    out_row = out_ptr + r.to(tl.int64) * k
    table_row = table_ptr
    if FUSE:
        table_row = table_ptr + tl.load(batch_ptr + r).to(tl.int64) * stride_table
    b, above, m, gt_before, c_before = _row_bin(ws_ptr, r, 0, S, k)
    use_cand = ((hi - lo) > k) & (m <= C)
    if use_cand:
        cand_row = cand_ptr + r.to(tl.int64) * C
        finish_candidates(row_ptr, cand_row, m, b, above, lo, k, out_row, table_row, page_size, BLOCK, FUSE)
    else:  # take-all window or overflowing threshold bin: the whole row in this program
        select_row(row_ptr, lo, hi, k, out_row, table_row, page_size, 8, BLOCK, FUSE)


def _table_args(out, starts, table, batch, page_size):
    if table is None:
        return out, 0, starts, 1, False
    return table, table.stride(0), batch, page_size, True


def launch_cand_rows(logits, starts, ends, out, k, table, batch, page_size, *, cap: int, block: int, warps: int):
    """One program per row; candidate buffer of ``min(cap, L)`` columns per row."""
    rows, width = logits.shape
    cap = max(1, min(cap, width))
    cand = torch.empty((rows, cap), dtype=torch.int32, device=logits.device)
    tab, stab, bat, ps, fuse = _table_args(out, starts, table, batch, page_size)
    _cand_rows_kernel[(rows,)](
        logits, logits.stride(0), starts, ends, out, cand, k, cap, tab, stab, bat, ps,
        BLOCK=block, FUSE=fuse, num_warps=warps,
    )


def launch_cand_split(logits, starts, ends, out, k, table, batch, page_size, *, split: int, cap: int,
                      block: int, warps: int, finish_block: int, finish_warps: int):
    """``split`` programs per row for the two row passes, then one per row over the candidates."""
    rows, width = logits.shape
    cap = max(1, min(cap, width))
    dev = logits.device
    ws = torch.empty((rows, split, 256), dtype=torch.int32, device=dev)
    cand = torch.empty((rows, cap), dtype=torch.int32, device=dev)
    tab, stab, bat, ps, fuse = _table_args(out, starts, table, batch, page_size)
    _cand_hist_kernel[(rows, split)](logits, logits.stride(0), starts, ends, ws, k, split, BLOCK=block, num_warps=warps)
    _cand_scatter_kernel[(rows, split)](
        logits, logits.stride(0), starts, ends, ws, out, cand, k, split, cap, tab, stab, bat, ps,
        BLOCK=block, FUSE=fuse, num_warps=warps,
    )
    _cand_finish_kernel[(rows,)](
        logits, logits.stride(0), starts, ends, ws, out, cand, k, split, cap, tab, stab, bat, ps,
        BLOCK=finish_block, FUSE=fuse, num_warps=finish_warps,
    )
