"""Exact top-k with a candidate buffer: two passes over the row, then radix passes over a few candidates (Triton).

Pass 1 histograms the top byte (256 bins) of every key of the window (keys as in :mod:`.topk_radix`) and
finds the threshold bin ``b``: ``above`` keys lie in higher bins, ``m`` in ``b``. Pass 2 reads the row once
more and writes every key of a higher bin straight to the output (at ``[0, above)``, column order), and
appends the columns and keys of bin ``b`` to a per-row candidate buffer (``[2, R, C]`` int32, column order: a
per-chunk ``tl.cumsum`` plus a running offset, no atomics). The remaining three 8-bit radix passes and the final write
(candidates above the threshold at ``[above, k - need)``, ties by ascending column at ``[k - need, k)``) then
read only the ``m`` candidates' keys (contiguous). When the top byte's threshold bin holds more
than ``C`` keys (logits within one binade), a second full-row histogram of the next byte inside that bin
narrows it to a 16-bit prefix first; a row whose 16-bit bin still holds more than ``C`` keys (heavy ties,
``-inf`` floods) takes the full multi-pass path instead. The kernels decide on the device from the counts
(no host sync), and nothing is written past ``C``. Selections are identical to
:func:`.topk_radix.select_row`'s (same output order too); windows of ``n <= k`` keys take the same
take-all path.

Two launch shapes: one program per row (many rows: one launch), and ``S`` programs per row for few long rows
(four launches: top-byte slice histograms; second-byte ones where needed, else a no-op; reduce + scatter;
one program per row finishing over the candidates).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsa_runtime.plugins.cuda_hopper.triton.topk_radix import (
    page_table_row,
    pass_hist,
    pick_bin,
    radix_key,
    select_row,
    table_args,
    to_slots,
)


@triton.jit
def scatter_top(row_ptr, a, c, lo, thr, sh, n_gt, n_c, out_row, cand_row, ckey_row, table_row, page_size,
                BLOCK: tl.constexpr, FUSE: tl.constexpr):
    """Columns ``[a, c)``: keys with ``key >> sh`` above ``thr`` go to ``out_row[n_gt + rank]``, those equal to
    it to ``cand_row[n_c + rank]`` (absolute columns) and their keys to ``ckey_row``, all in column order."""
    offs = tl.arange(0, BLOCK)
    for c0 in range(a, c, BLOCK):
        cols = c0 + offs
        inside = cols < c
        x = tl.load(row_ptr + cols, mask=inside, other=0.0)
        full_key = radix_key(x)
        key = full_key >> sh
        gt = inside & (key > thr)
        cd = inside & (key == thr)
        gt_rank = n_gt + tl.cumsum(gt.to(tl.int32), 0) - 1
        cd_rank = n_c + tl.cumsum(cd.to(tl.int32), 0) - 1
        val = cols - lo
        if FUSE:
            val = to_slots(val, table_row, page_size, gt)
        tl.store(out_row + gt_rank, val, mask=gt)
        tl.store(cand_row + cd_rank, cols, mask=cd)
        tl.store(ckey_row + cd_rank, full_key, mask=cd)
        n_gt += tl.sum(gt.to(tl.int32), 0)
        n_c += tl.sum(cd.to(tl.int32), 0)


@triton.jit
def finish_candidates(cand_row, ckey_row, m, prefix, d, above, lo, k, out_row, table_row, page_size,
                      BLOCK: tl.constexpr, FUSE: tl.constexpr):
    """The ``m`` candidates (columns whose top ``d`` bytes equal ``prefix``'s, unsigned domain; ``above`` keys
    already written): radix passes over bytes ``d..3``, then the candidates above the threshold and the first
    ties by column. A pass that finds every remaining candidate equal ends the search at once (tie floods)."""
    offs = tl.arange(0, BLOCK)
    need = k - above
    sh = 32 - 8 * d
    done = (m == need).to(tl.int32)
    for p in tl.static_range(1, 4):
        shift = 24 - 8 * p  # plain names: the compiler refuses re-binding a constexpr in an unrolled loop
        hi_shift = 32 - 8 * p
        active = (done == 0) & (d <= p)
        hist = tl.zeros([256], dtype=tl.int32)
        kmin = tl.full([], 2147483647, tl.int32)
        kmax = tl.full([], -2147483648, tl.int32)
        end = tl.where(active, m, 0)
        for c0 in range(0, end, BLOCK):
            i = c0 + offs
            inside = i < end
            key = tl.load(ckey_row + i, mask=inside, other=0)
            v = key ^ -2147483648
            inside = inside & ((v >> hi_shift) == (prefix >> hi_shift))
            hist += tl.histogram((v >> shift) & 255, 256, mask=inside)
            kmin = tl.minimum(kmin, tl.min(tl.where(inside, key, 2147483647), 0))
            kmax = tl.maximum(kmax, tl.max(tl.where(inside, key, -2147483648), 0))
        bb, ab, in_bin = pick_bin(hist, tl.maximum(need, 1), 8)
        new_need = need - ab
        # all remaining candidates equal: the threshold is that key (none above it: need is unchanged)
        same = active & (kmin == kmax)
        prefix = tl.where(active, prefix | (bb << shift), prefix)
        sh = tl.where(active, shift, sh)
        need = tl.where(active, new_need, need)
        done = tl.where(active & (in_bin == new_need), 1, done)
        prefix = tl.where(same, kmax ^ -2147483648, prefix)
        sh = tl.where(same, 0, sh)
        done = tl.where(same, 1, done)
    thr = (prefix ^ -2147483648) >> sh
    eq_base = k - need
    n_gt = above
    n_eq = tl.zeros([], dtype=tl.int32)
    for c0 in range(0, m, BLOCK):
        i = c0 + offs
        inside = i < m
        key = tl.load(ckey_row + i, mask=inside, other=0) >> sh
        gt = inside & (key > thr)
        eq = inside & (key == thr)
        gt_rank = n_gt + tl.cumsum(gt.to(tl.int32), 0) - 1
        eq_rank = n_eq + tl.cumsum(eq.to(tl.int32), 0) - 1
        eq = eq & (eq_rank < need)
        dest = tl.where(gt, gt_rank, eq_base + eq_rank)
        col = tl.load(cand_row + i, mask=gt | eq, other=0)
        val = col - lo
        if FUSE:
            val = to_slots(val, table_row, page_size, gt | eq)
        tl.store(out_row + dest, val, mask=gt | eq)
        n_gt += tl.sum(gt.to(tl.int32), 0)
        n_eq += tl.sum(eq.to(tl.int32), 0)


@triton.jit
def _cand_rows_kernel(
    logits_ptr, stride_row, starts_ptr, ends_ptr, out_ptr, cand_ptr, ckey_ptr, k, C,
    table_ptr, stride_table, batch_ptr, page_size,
    BLOCK: tl.constexpr, FUSE: tl.constexpr,
):
    """One program per row: top-byte histogram (and the second byte's when the first bin exceeds ``C``), then
    the candidate path, or the full search (bin still over ``C``; take-all windows ``n <= k``)."""
    r = tl.program_id(0)
    row_ptr = logits_ptr + r.to(tl.int64) * stride_row
    lo = tl.load(starts_ptr + r).to(tl.int32)
    hi = tl.load(ends_ptr + r).to(tl.int32)
    out_row = out_ptr + r.to(tl.int64) * k
    cand_row = cand_ptr + r.to(tl.int64) * C
    ckey_row = ckey_ptr + r.to(tl.int64) * C
    table_row = page_table_row(table_ptr, stride_table, batch_ptr, r, FUSE)
    search = (hi - lo) > k
    hist = pass_hist(row_ptr, lo, hi, tl.zeros([], dtype=tl.int32), search, 0, 8, BLOCK)
    b0, above0, m0 = pick_bin(hist, k, 8)
    deeper = search & (m0 > C)
    hist = pass_hist(row_ptr, lo, hi, b0 << 24, deeper, 1, 8, BLOCK)
    b1, above1, m1 = pick_bin(hist, tl.maximum(k - above0, 1), 8)
    d = tl.where(deeper, 2, 1)
    prefix = tl.where(deeper, (b0 << 24) | (b1 << 16), b0 << 24)
    above = tl.where(deeper, above0 + above1, above0)
    m = tl.where(deeper, m1, m0)
    if search & (m <= C):
        zero = tl.zeros([], dtype=tl.int32)
        sh = 32 - 8 * d
        scatter_top(row_ptr, lo, hi, lo, (prefix ^ -2147483648) >> sh, sh, zero, zero, out_row, cand_row,
                    ckey_row, table_row, page_size, BLOCK, FUSE)
        tl.debug_barrier()  # the candidates were stored by other threads of this program
        finish_candidates(cand_row, ckey_row, m, prefix, d, above, lo, k, out_row, table_row, page_size, BLOCK,
                          FUSE)
    else:
        select_row(row_ptr, lo, hi, k, out_row, table_row, page_size, 8, BLOCK, FUSE)


@triton.jit
def _row_bin(ws_ptr, r, s, S, need, live):
    """Reduce row ``r``'s slice histograms at ``ws_ptr``: ``(b, above, m, gt_before, c_before)`` for the
    ``need``-th key (the last two: counts of the slices before ``s``, above and in bin ``b``); ``live`` False:
    nothing is read (the results are then meaningless and unused)."""
    idx = tl.arange(0, 256)
    tot = tl.zeros([256], dtype=tl.int32)
    before = tl.zeros([256], dtype=tl.int32)
    base = ws_ptr + r.to(tl.int64) * S * 256
    for j in range(0, tl.where(live, S, 0)):
        h = tl.load(base + j * 256 + idx)
        tot += h
        before += tl.where(j < s, h, 0)
    b, above, m = pick_bin(tot, tl.maximum(need, 1), 8)
    gt_before = tl.sum(tl.where(idx > b, before, 0), 0)
    c_before = tl.sum(tl.where(idx == b, before, 0), 0)
    return b, above, m, gt_before, c_before


@triton.jit
def _row_plan(ws_ptr, r, s, S, R, k, C):
    """Both levels of the split search: ``(prefix, d, above, m, gt_before, c_before)`` (depth ``d`` bytes)."""
    b0, above0, m0, gt0, c0 = _row_bin(ws_ptr, r, s, S, k, True)
    deeper = m0 > C
    level1 = ws_ptr + R * S * 256  # no .to(): R == 1 is specialised to a constexpr on the GPU
    b1, above1, m1, gt1, c1 = _row_bin(level1, r, s, S, k - above0, deeper)
    d = tl.where(deeper, 2, 1)
    prefix = tl.where(deeper, (b0 << 24) | (b1 << 16), b0 << 24)
    above = tl.where(deeper, above0 + above1, above0)
    m = tl.where(deeper, m1, m0)
    gt_before = tl.where(deeper, gt0 + gt1, gt0)
    c_before = tl.where(deeper, c1, c0)
    return prefix, d, above, m, gt_before, c_before


@triton.jit
def _slice_of(starts_ptr, ends_ptr, r, s, S):
    lo = tl.load(starts_ptr + r).to(tl.int32)
    hi = tl.load(ends_ptr + r).to(tl.int32)
    per = (hi - lo + S - 1) // S
    a = tl.minimum(lo + s * per, hi)
    return lo, hi, a, tl.minimum(a + per, hi)


@triton.jit
def _cand_hist_kernel(logits_ptr, stride_row, starts_ptr, ends_ptr, ws_ptr, k, S, R, C,
                      LEVEL: tl.constexpr, BLOCK: tl.constexpr):
    """Slice histogram of the top byte (``LEVEL`` 0) or of the second byte inside the top byte's threshold bin
    (``LEVEL`` 1, only for rows whose top bin exceeds ``C``; zeros otherwise)."""
    r = tl.program_id(0)
    s = tl.program_id(1)
    lo, hi, a, c = _slice_of(starts_ptr, ends_ptr, r, s, S)
    row_ptr = logits_ptr + r.to(tl.int64) * stride_row
    search = (hi - lo) > k
    if LEVEL == 0:
        hist = pass_hist(row_ptr, a, c, tl.zeros([], dtype=tl.int32), search, 0, 8, BLOCK)
    else:
        b0, above0, m0, gt0, c0 = _row_bin(ws_ptr, r, s, S, k, (hi - lo) > k)
        hist = pass_hist(row_ptr, a, c, b0 << 24, search & (m0 > C), 1, 8, BLOCK)
    tl.store(ws_ptr + ((LEVEL * R + r).to(tl.int64) * S + s) * 256 + tl.arange(0, 256), hist)


@triton.jit
def _cand_scatter_kernel(
    logits_ptr, stride_row, starts_ptr, ends_ptr, ws_ptr, out_ptr, cand_ptr, ckey_ptr, k, S, R, C,
    table_ptr, stride_table, batch_ptr, page_size,
    BLOCK: tl.constexpr, FUSE: tl.constexpr,
):
    r = tl.program_id(0)
    s = tl.program_id(1)
    lo, hi, a, c = _slice_of(starts_ptr, ends_ptr, r, s, S)
    row_ptr = logits_ptr + r.to(tl.int64) * stride_row
    out_row = out_ptr + r.to(tl.int64) * k
    table_row = page_table_row(table_ptr, stride_table, batch_ptr, r, FUSE)
    prefix, d, above, m, gt_before, c_before = _row_plan(ws_ptr, r, s, S, R, k, C)
    if ((hi - lo) > k) & (m <= C):
        cand_row = cand_ptr + r.to(tl.int64) * C
        ckey_row = ckey_ptr + r.to(tl.int64) * C
        sh = 32 - 8 * d
        scatter_top(row_ptr, a, c, lo, (prefix ^ -2147483648) >> sh, sh, gt_before, c_before, out_row, cand_row,
                    ckey_row, table_row, page_size, BLOCK, FUSE)


@triton.jit
def _cand_finish_kernel(
    logits_ptr, stride_row, starts_ptr, ends_ptr, ws_ptr, out_ptr, cand_ptr, ckey_ptr, k, S, R, C,
    table_ptr, stride_table, batch_ptr, page_size,
    BLOCK: tl.constexpr, FUSE: tl.constexpr,
):
    r = tl.program_id(0)
    lo = tl.load(starts_ptr + r).to(tl.int32)
    hi = tl.load(ends_ptr + r).to(tl.int32)
    row_ptr = logits_ptr + r.to(tl.int64) * stride_row
    out_row = out_ptr + r.to(tl.int64) * k
    table_row = page_table_row(table_ptr, stride_table, batch_ptr, r, FUSE)
    prefix, d, above, m, gt_before, c_before = _row_plan(ws_ptr, r, 0, S, R, k, C)
    if ((hi - lo) > k) & (m <= C):
        cand_row = cand_ptr + r.to(tl.int64) * C
        ckey_row = ckey_ptr + r.to(tl.int64) * C
        finish_candidates(cand_row, ckey_row, m, prefix, d, above, lo, k, out_row, table_row, page_size, BLOCK,
                          FUSE)
    else:  # take-all window or a threshold bin over C even at 16 bits: the whole row in this program
        select_row(row_ptr, lo, hi, k, out_row, table_row, page_size, 8, BLOCK, FUSE)


def launch_cand_rows(logits, starts, ends, out, k, table, batch, page_size, *, cap: int, block: int, warps: int):
    """One program per row; candidate buffer of ``min(cap, L)`` columns per row."""
    rows, width = logits.shape
    cap = max(1, min(cap, width))
    cand = torch.empty((2, rows, cap), dtype=torch.int32, device=logits.device)  # columns, keys
    tab, stab, bat, ps, fuse = table_args(out, starts, table, batch, page_size)
    _cand_rows_kernel[(rows,)](
        logits, logits.stride(0), starts, ends, out, cand[0], cand[1], k, cap, tab, stab, bat, ps,
        BLOCK=block, FUSE=fuse, num_warps=warps,
    )


def launch_cand_split(logits, starts, ends, out, k, table, batch, page_size, *, split: int, cap: int,
                      block: int, warps: int, finish_block: int, finish_warps: int):
    """``split`` programs per row for the histograms (top byte; second byte only where the top bin exceeds
    ``cap``) and the scatter pass, then one program per row over the candidates: four launches."""
    rows, width = logits.shape
    cap = max(1, min(cap, width))
    dev = logits.device
    ws = torch.empty((2, rows, split, 256), dtype=torch.int32, device=dev)
    cand = torch.empty((2, rows, cap), dtype=torch.int32, device=dev)  # columns, keys
    tab, stab, bat, ps, fuse = table_args(out, starts, table, batch, page_size)
    for level in (0, 1):
        _cand_hist_kernel[(rows, split)](
            logits, logits.stride(0), starts, ends, ws, k, split, rows, cap, LEVEL=level, BLOCK=block, num_warps=warps,
        )
    _cand_scatter_kernel[(rows, split)](
        logits, logits.stride(0), starts, ends, ws, out, cand[0], cand[1], k, split, rows, cap, tab, stab, bat, ps,
        BLOCK=block, FUSE=fuse, num_warps=warps,
    )
    _cand_finish_kernel[(rows,)](
        logits, logits.stride(0), starts, ends, ws, out, cand[0], cand[1], k, split, rows, cap, tab, stab, bat, ps,
        BLOCK=finish_block, FUSE=fuse, num_warps=finish_warps,
    )
