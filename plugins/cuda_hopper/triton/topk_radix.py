"""Exact windowed top-k by radix select, one program per row (Triton).

Every logit maps to a signed int32 key whose order is the fp32 order (``s = bits ^ ((bits >> 31) & 0x7FFFFFFF)``),
with NaN mapped to the key of ``-inf`` and ``-0.0`` to the key of ``+0.0`` so that equal keys are exactly the
values the reference treats as equal. Radix passes then find the k-th largest key of the window: pass ``p``
histograms digit ``p`` (``BITS`` bits, from the top) of the keys that share the high bits found so far, and
the cumulative counts from the top give the bin holding the k-th key. Counts are integers, so the result is
deterministic. A pass whose threshold bin is taken whole (its count equals what is still needed) ends the
search early, which is the common case for random logits after 2 passes of 11 bits.

The final pass writes every key above the threshold, then the keys equal to it by ascending column until k
(a per-chunk ``tl.cumsum`` plus running offsets: no atomics, so output order and tie choice are fixed and
ties go to the lower column, as in the reference). A window of ``n <= k`` keys skips the search and writes
positions ``0..n-1``; the rest of the row is ``-1``. No buffer is sized by data: the only memory is the
``[R, k]`` output.

The same search split over several programs per row (for few long rows) lives in :mod:`.topk_split`; the
shared per-chunk pieces are the ``@triton.jit`` helpers here.
"""

from __future__ import annotations

import triton
import triton.language as tl

INT_MIN = -2147483648


@triton.jit
def radix_key(x):
    """fp32 -> int32 key with the fp32 order; NaN -> key(-inf), -0.0 -> key(+0.0)."""
    bits = x.to(tl.int32, bitcast=True)
    bits = tl.where(x != x, -8388608, bits)  # 0xFF800000: -inf
    bits = tl.where(bits == -2147483648, 0, bits)  # -0.0 ranks with +0.0
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def pass_hist(
    row_ptr, lo, hi, prefix, live, p: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr
):
    """Histogram ``[2**BITS]`` int32 of digit ``p`` of the keys in columns ``[lo, hi)`` whose higher digits equal
    ``prefix``'s (``prefix`` is in the unsigned domain ``key ^ INT_MIN``). ``live`` False: all zeros, no loads."""
    NB: tl.constexpr = 1 << BITS
    SHIFT: tl.constexpr = 32 - (p + 1) * BITS if 32 - (p + 1) * BITS > 0 else 0
    HI_SHIFT: tl.constexpr = 32 - p * BITS
    hist = tl.zeros([NB], dtype=tl.int32)
    offs = tl.arange(0, BLOCK)
    end = tl.where(live, hi, lo)
    for c0 in range(lo, end, BLOCK):
        cols = c0 + offs
        inside = cols < end
        x = tl.load(row_ptr + cols, mask=inside, other=0.0)
        v = radix_key(x) ^ -2147483648
        if p > 0:
            inside = inside & ((v >> HI_SHIFT) == (prefix >> HI_SHIFT))
        digit = (v >> SHIFT) & (NB - 1)
        hist += tl.histogram(digit, NB, mask=inside)
    return hist


@triton.jit
def pick_bin(hist, need, BITS: tl.constexpr):
    """Bin holding the ``need``-th largest key (counting from the top) and how many keys lie above it:
    ``(bin, above, in_bin)``. Requires ``sum(hist) >= need >= 1``."""
    NB: tl.constexpr = 1 << BITS
    idx = tl.arange(0, NB)
    total = tl.sum(hist, 0)
    from_top = total - tl.cumsum(hist, 0) + hist  # keys in bins >= b
    b = tl.max(tl.where(from_top >= need, idx, 0), 0)
    above = tl.sum(tl.where(idx > b, hist, 0), 0)
    in_bin = tl.sum(tl.where(idx == b, hist, 0), 0)
    return b, above, in_bin


def table_args(out, starts, table, batch, page_size):
    """A kernel's ``(table, stride_table, batch, page_size, FUSE)``: the page table when slots are wanted, else
    placeholders the kernel never reads (``table`` None: positions)."""
    if table is None:
        return out, 0, starts, 1, False
    return table, table.stride(0), batch, page_size, True


@triton.jit
def page_table_row(table_ptr, stride_table, batch_ptr, r, FUSE: tl.constexpr):
    """Row ``r``'s page-table row (its request's, ``batch_ptr[r]``) when ``FUSE``, else ``table_ptr`` unused."""
    table_row = table_ptr
    if FUSE:
        table_row = table_ptr + tl.load(batch_ptr + r).to(tl.int64) * stride_table
    return table_row


@triton.jit
def to_slots(pos, table_row_ptr, page_size, mask):
    """Request positions -> KV slots through one request's page-table row (read only where ``mask``)."""
    page = tl.load(table_row_ptr + pos // page_size, mask=mask, other=0)
    return page * page_size + pos % page_size


@triton.jit
def select_row(
    row_ptr, lo, hi, k, out_row, table_row, page_size,
    BITS: tl.constexpr, BLOCK: tl.constexpr, FUSE: tl.constexpr,
):
    """One program selects one row: the full radix search over columns ``[lo, hi)``, then the ``[k]`` output
    row (slots through ``table_row`` when ``FUSE``), ``-1`` padded."""
    NPASS: tl.constexpr = (32 + BITS - 1) // BITS
    n = hi - lo
    # need: keys still to take at the threshold; done: threshold found; thr/sh: threshold key >> sh.
    take_all = (n <= k).to(tl.int32)
    need = tl.where(take_all != 0, 0, k)
    done = take_all
    prefix = tl.zeros([], dtype=tl.int32)  # unsigned-domain key with the digits found so far
    sh = tl.zeros([], dtype=tl.int32)
    for p in tl.static_range(NPASS):
        # a plain name: the compiler refuses re-binding a constexpr-annotated one in an unrolled loop
        shift = 32 - (p + 1) * BITS if 32 - (p + 1) * BITS > 0 else 0
        hist = pass_hist(row_ptr, lo, hi, prefix, done == 0, p, BITS, BLOCK)
        b, above, in_bin = pick_bin(hist, tl.maximum(need, 1), BITS)
        new_need = need - above
        upd = done == 0
        prefix = tl.where(upd, prefix | (b << shift), prefix)
        sh = tl.where(upd, shift, sh)
        need = tl.where(upd, new_need, need)
        done = tl.where(upd & (in_bin == new_need), 1, done)
    # Threshold in the signed key domain; a take-all row uses INT_MIN (below every real key: all "above").
    thr = tl.where(take_all != 0, -2147483648, (prefix ^ -2147483648) >> sh)
    sh = tl.where(take_all != 0, 0, sh)
    eq_base = k - need  # keys above the threshold fill [0, k - need); ties fill the rest
    offs = tl.arange(0, BLOCK)
    n_gt = tl.zeros([], dtype=tl.int32)
    n_eq = tl.zeros([], dtype=tl.int32)
    for c0 in range(lo, hi, BLOCK):
        n_gt, n_eq = write_block(row_ptr, out_row, c0 + offs, hi, lo, sh, thr, take_all, need, eq_base, n_gt, n_eq,
                                 table_row, page_size, FUSE)
    filled = tl.minimum(n, k)
    for c0 in range(filled, k, BLOCK):
        idx = c0 + offs
        tl.store(out_row + idx, tl.full([BLOCK], -1, tl.int32), mask=idx < k)


@triton.jit
def write_block(row_ptr, out_row, cols, end, lo, sh, thr, take_all, need, eq_base, n_gt, n_eq, table_row, page_size,
                FUSE: tl.constexpr):
    """Final pass over one block of columns (``< end``): keys above the threshold go to ``n_gt + rank``, ties
    to ``eq_base + n_eq + rank`` while fewer than ``need`` are taken, both in column order (deterministic, ties to
    the lower column); positions are row-relative, or slots when ``FUSE``. Returns the updated counts (``n_eq``
    counts every tie seen: one past ``need`` is never taken either way)."""
    inside = cols < end
    x = tl.load(row_ptr + cols, mask=inside, other=0.0)
    key = radix_key(x) >> sh
    gt = inside & (key > thr)
    eq = inside & (key == thr) & (take_all == 0)
    gt_rank = n_gt + tl.cumsum(gt.to(tl.int32), 0) - 1
    eq_rank = n_eq + tl.cumsum(eq.to(tl.int32), 0) - 1
    take = eq & (eq_rank < need)
    dest = tl.where(gt, gt_rank, eq_base + eq_rank)
    val = cols - lo
    if FUSE:
        val = to_slots(val, table_row, page_size, gt | take)
    tl.store(out_row + dest, val, mask=gt | take)
    return n_gt + tl.sum(gt.to(tl.int32), 0), n_eq + tl.sum(eq.to(tl.int32), 0)


@triton.jit
def _topk_rows_kernel(
    logits_ptr, stride_row, starts_ptr, ends_ptr, out_ptr, k,
    table_ptr, stride_table, batch_ptr, page_size,
    BITS: tl.constexpr, BLOCK: tl.constexpr, FUSE: tl.constexpr,
):
    """One program per row: search, then write the ``[k]`` output row (slots when ``FUSE``)."""
    r = tl.program_id(0)
    row_ptr = logits_ptr + r.to(tl.int64) * stride_row
    lo = tl.load(starts_ptr + r).to(tl.int32)
    hi = tl.load(ends_ptr + r).to(tl.int32)
    out_row = out_ptr + r.to(tl.int64) * k
    table_row = page_table_row(table_ptr, stride_table, batch_ptr, r, FUSE)
    select_row(row_ptr, lo, hi, k, out_row, table_row, page_size, BITS, BLOCK, FUSE)


def launch_rows(logits, starts, ends, out, k, table, batch, page_size, *, bits: int, block: int, warps: int):
    """Launch the one-program-per-row kernel (``table``/``batch`` None: positions, else slots)."""
    table, stride_table, batch, page_size, fuse = table_args(out, starts, table, batch, page_size)
    _topk_rows_kernel[(logits.shape[0],)](
        logits, logits.stride(0), starts, ends, out, k, table, stride_table, batch, page_size,
        BITS=bits, BLOCK=block, FUSE=fuse, num_warps=warps,
    )
