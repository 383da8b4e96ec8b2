"""The radix search of :mod:`.topk_radix` split over ``S`` programs per row, for few long rows (Triton).

Program ``(r, s)`` owns slice ``s`` of row ``r``'s window (``ceil(n / S)`` columns). Launch ``p`` of the
histogram kernel first reduces pass ``p - 1``'s partial histograms of all ``S`` slices (``ws[(p-1) % 2]``,
``[R, S, 2**BITS]`` int32, written whole by that launch) to the same threshold bin in every program of the
row, then histograms its own slice for pass ``p`` into ``ws[p % 2]`` (two buffers: a program must not
overwrite counts that a sibling still reads). While reducing, each program also sums the counts of the
slices *before* its own, in bins above the chosen one: that is how many keys above the threshold precede its
slice, so the final launch writes its slice's selection at fixed offsets (no atomics, no extra counting
pass). Launches: ``ceil(32 / BITS)`` histogram passes + 1 final, whatever the data; a row whose search ends
early skips the later passes' work. Per-program state (``[R, S, 8]`` int32) is read and written only by
its own program. Every buffer is sized from shapes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsa_runtime.plugins.cuda_hopper.triton.topk_radix import (
    page_table_row,
    pass_hist,
    pick_bin,
    table_args,
    write_block,
)

# state fields, per (row, split); tl.constexpr globals, which compiled kernels may read (the interpreter
# also accepts plain ints, the compiler does not)
_PREFIX, _NEED, _DONE, _SH = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2), tl.constexpr(3)
_GT_BEFORE, _EQ_BEFORE, _TAKE_ALL = tl.constexpr(4), tl.constexpr(5), tl.constexpr(6)
STATE = 8


@triton.jit
def _slice(starts_ptr, ends_ptr, r, s, S):
    lo = tl.load(starts_ptr + r).to(tl.int32)
    hi = tl.load(ends_ptr + r).to(tl.int32)
    n = hi - lo
    per = (n + S - 1) // S
    a = tl.minimum(lo + s * per, hi)
    b = tl.minimum(a + per, hi)
    return lo, hi, n, a, b


@triton.jit
def _reduce_update(ws_ptr, st_ptr, r, s, S, R, p: tl.constexpr, BITS: tl.constexpr):
    """Fold pass ``p``'s partial histograms (all slices) into this program's state; returns and stores
    ``(prefix, need, done, sh, gt_before, eq_before)``. The values are carried in registers: a program never
    reads back what it stored in the same launch (other threads of the CTA could see the old value)."""
    NB: tl.constexpr = 1 << BITS
    SHIFT: tl.constexpr = 32 - (p + 1) * BITS if 32 - (p + 1) * BITS > 0 else 0
    prefix = tl.load(st_ptr + _PREFIX)
    need = tl.load(st_ptr + _NEED)
    done = tl.load(st_ptr + _DONE)
    sh = tl.load(st_ptr + _SH)
    gt_before = tl.load(st_ptr + _GT_BEFORE)
    eq_before = tl.load(st_ptr + _EQ_BEFORE)
    idx = tl.arange(0, NB)
    tot = tl.zeros([NB], dtype=tl.int32)
    before = tl.zeros([NB], dtype=tl.int32)
    base = ws_ptr + ((p % 2) * R + r).to(tl.int64) * S * NB
    end = tl.where(done == 0, S, 0)
    for j in range(0, end):
        h = tl.load(base + j * NB + idx)
        tot += h
        before += tl.where(j < s, h, 0)
    b, above, in_bin = pick_bin(tot, tl.maximum(need, 1), BITS)
    upd = done == 0
    new_need = need - above
    prefix = tl.where(upd, prefix | (b << SHIFT), prefix)
    sh = tl.where(upd, SHIFT, sh)
    gt_before = tl.where(upd, gt_before + tl.sum(tl.where(idx > b, before, 0), 0), gt_before)
    eq_before = tl.where(upd, tl.sum(tl.where(idx == b, before, 0), 0), eq_before)
    done = tl.where(upd & (in_bin == new_need), 1, done)
    need = tl.where(upd, new_need, need)
    tl.store(st_ptr + _PREFIX, prefix)
    tl.store(st_ptr + _NEED, need)
    tl.store(st_ptr + _DONE, done)
    tl.store(st_ptr + _SH, sh)
    tl.store(st_ptr + _GT_BEFORE, gt_before)
    tl.store(st_ptr + _EQ_BEFORE, eq_before)
    return prefix, need, done, sh, gt_before, eq_before


@triton.jit
def _split_hist_kernel(
    logits_ptr, stride_row, starts_ptr, ends_ptr, ws_ptr, state_ptr, k, S, R,
    p: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr,
):
    NB: tl.constexpr = 1 << BITS
    r = tl.program_id(0)
    s = tl.program_id(1)
    lo, hi, n, a, b = _slice(starts_ptr, ends_ptr, r, s, S)
    st = state_ptr + (r * S + s).to(tl.int64) * 8
    if p == 0:
        take_all = (n <= k).to(tl.int32)
        prefix = tl.zeros([], dtype=tl.int32)
        done = take_all
        tl.store(st + _PREFIX, prefix)
        tl.store(st + _NEED, tl.where(take_all != 0, 0, k))
        tl.store(st + _DONE, take_all)
        tl.store(st + _SH, 0)
        tl.store(st + _GT_BEFORE, 0)
        tl.store(st + _EQ_BEFORE, 0)
        tl.store(st + _TAKE_ALL, take_all)
    else:
        prefix, need, done, sh, gt_before, eq_before = _reduce_update(ws_ptr, st, r, s, S, R, p - 1, BITS)
    if done == 0:
        row_ptr = logits_ptr + r.to(tl.int64) * stride_row
        hist = pass_hist(row_ptr, a, b, prefix, done == 0, p, BITS, BLOCK)
        dst = ws_ptr + (((p % 2) * R + r).to(tl.int64) * S + s) * NB
        tl.store(dst + tl.arange(0, NB), hist)


@triton.jit
def _split_final_kernel(
    logits_ptr, stride_row, starts_ptr, ends_ptr, ws_ptr, state_ptr, out_ptr, k, S, R,
    table_ptr, stride_table, batch_ptr, page_size,
    NPASS: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr, FUSE: tl.constexpr,
):
    r = tl.program_id(0)
    s = tl.program_id(1)
    lo, hi, n, a, b = _slice(starts_ptr, ends_ptr, r, s, S)
    st = state_ptr + (r * S + s).to(tl.int64) * 8
    prefix, need, done, sh, gt_before, n_eq = _reduce_update(ws_ptr, st, r, s, S, R, NPASS - 1, BITS)
    take_all = tl.load(st + _TAKE_ALL)
    sh = tl.where(take_all != 0, 0, sh)
    thr = tl.where(take_all != 0, -2147483648, (prefix ^ -2147483648) >> sh)
    n_gt = tl.where(take_all != 0, a - lo, gt_before)
    eq_base = k - need
    row_ptr = logits_ptr + r.to(tl.int64) * stride_row
    out_row = out_ptr + r.to(tl.int64) * k
    table_row = page_table_row(table_ptr, stride_table, batch_ptr, r, FUSE)
    offs = tl.arange(0, BLOCK)
    for c0 in range(a, b, BLOCK):
        n_gt, n_eq = write_block(row_ptr, out_row, c0 + offs, b, lo, sh, thr, take_all, need, eq_base, n_gt, n_eq,
                                 table_row, page_size, FUSE)
    filled = tl.minimum(n, k)
    for c0 in range(filled + s * BLOCK, k, S * BLOCK):
        idx = c0 + offs
        tl.store(out_row + idx, tl.full([BLOCK], -1, tl.int32), mask=idx < k)


def launch_split(logits, starts, ends, out, k, table, batch, page_size, *, split: int, cfg) -> None:
    """Run the split search with ``split`` programs per row (``table``/``batch`` None: positions, else slots)."""
    rows = logits.shape[0]
    bits, block = cfg.bits, cfg.split_block
    npass = -(-32 // bits)
    dev = logits.device
    ws = torch.empty((2, rows, split, 1 << bits), dtype=torch.int32, device=dev)
    state = torch.empty((rows, split, STATE), dtype=torch.int32, device=dev)
    grid = (rows, split)
    for p in range(npass):
        _split_hist_kernel[grid](
            logits, logits.stride(0), starts, ends, ws, state, k, split, rows,
            p=p, BITS=bits, BLOCK=block, num_warps=cfg.split_warps,
        )
    table, stride_table, batch, page_size, fuse = table_args(out, starts, table, batch, page_size)
    _split_final_kernel[grid](
        logits, logits.stride(0), starts, ends, ws, state, out, k, split, rows,
        table, stride_table, batch, page_size,
        NPASS=npass, BITS=bits, BLOCK=block, FUSE=fuse, num_warps=cfg.split_warps,
    )
