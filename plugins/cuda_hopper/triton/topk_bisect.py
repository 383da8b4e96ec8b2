"""Exact top-k for rows that fit in one program's registers: one read of the row, then a bit-by-bit search.

A row of up to 32K fp32 logits fits in the registers of one program (64 keys per thread at 16 warps), so the
window is read from memory once and kept as int32 keys (the order-preserving keys of :mod:`.topk_radix`). The
k-th largest key is then built one bit at a time from the top, in the unsigned key domain: bit ``b`` is kept
when at least ``k`` keys are ``>=`` the prefix with that bit set. Each step is one compare-and-count over the
registers (a block-wide ``tl.sum``), so the cost does not depend on the data (ties and ``-inf`` floods cost what
random rows cost) and there are no histograms, which dominate the radix passes in Triton. The search stops as
soon as a prefix is matched by exactly ``k`` keys (random rows: after about ``log2(n) + 2`` steps).

The final pass is :func:`.topk_radix.write_block`'s (the row comes from L2 this time): keys above the threshold
by ascending column, then ties by ascending column until ``k``, ``-1`` padding, and slots through the page
table when fused. Selections are identical to :func:`.topk_radix.select_row`'s; the order inside a row is too
when the search runs to the last bit, while an early stop makes every selected key "above" its prefix, so the
row is in plain column order (fixed for a given input either way: deterministic). Nothing is sized by data and
nothing syncs with the host: CUDA-graph capturable.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsa_runtime.plugins.cuda_hopper.triton.pdl import grid_sync, pdl_kwargs
from dsa_runtime.plugins.cuda_hopper.triton.topk import BISECT_MAX_WIDTH as MAX_WIDTH
from dsa_runtime.plugins.cuda_hopper.triton.topk_radix import (
    page_table_row,
    radix_key,
    table_args,
    to_slots,
    write_block,
)


def bisect_width(width: int) -> int:
    """Columns one program holds: the row length rounded up to a power of two (at least 1024)."""
    return max(1024, 1 << max(0, (width - 1).bit_length()))


def bisect_warps(block_width: int, keys_per_thread: int = 0) -> int:
    """Warps so that each thread holds ``keys_per_thread`` keys (4..32); 0: 32 keys up to 8K columns, 64 above."""
    per = keys_per_thread or (32 if block_width <= 8192 else 64)
    return min(32, max(4, block_width // (32 * per)))


@triton.jit
def kth_key(key, k, live):
    """The ``k``-th largest of the int32 ``key`` values (padding is ``INT_MIN``, which no logit's key equals:
    it never counts; more than ``k`` real keys when ``live``; returns ``INT_MIN`` when not ``live``). Built from
    the top bit in the unsigned domain (``u = key ^ INT_MIN``, padding ``u = 0``, every prefix tried ``>= 1``);
    stops early once exactly ``k`` keys reach the prefix (that prefix then selects exactly the top ``k`` as
    ``key >= prefix``, which the caller's ``> thr`` / ``== thr`` split handles).

    One bit per step. Two bits per step (three counts packed in one int64 sum, half the block-wide reductions)
    was measured slower on the H200 (2026-11-26, load + search at 64 x 32K: 0.042 vs 0.033 ms; 4096 x 8K: 0.227
    vs 0.166): the three compares and 64-bit adds per key cost more than the reductions they save."""
    thr_u = tl.zeros([], dtype=tl.int32)
    bit = tl.where(live, tl.full([], -2147483648, tl.int32), 0)
    while bit != 0:
        cand_u = thr_u | bit
        cnt = tl.sum((key >= (cand_u ^ -2147483648)).to(tl.int32), 0)
        thr_u = tl.where(cnt >= k, cand_u, thr_u)
        # arithmetic >> on the top bit would smear it: mask to a logical shift
        bit = tl.where(cnt == k, 0, (bit >> 1) & 0x7FFFFFFF)
    return thr_u ^ -2147483648


@triton.jit
def threshold(key, n, k):
    """``(thr, take_all, need)`` for ``n`` real keys (padding ``INT_MIN``): the k-th largest key (``INT_MIN`` when
    all ``n <= k`` are taken, flagged by ``take_all``) and how many keys equal to it complete the top-k."""
    take_all = (n <= k).to(tl.int32)
    thr = kth_key(key, k, take_all == 0)
    need = tl.where(take_all != 0, 0, k - tl.sum((key > thr).to(tl.int32), 0))
    return thr, take_all, need


@triton.jit
def fill_tail(row_ptr, start, k, VALUE: tl.constexpr, BLOCK: tl.constexpr):
    """``row_ptr[start:k] = VALUE`` (int32): the padding after a row's selected entries."""
    offs = tl.arange(0, BLOCK)
    for c0 in range(start, k, BLOCK):
        idx = c0 + offs
        tl.store(row_ptr + idx, tl.full([BLOCK], VALUE, tl.int32), mask=idx < k)


@triton.jit
def rank_selected(key, thr, take_all, need):
    """Where each selected key goes in a ``[k]`` row: keys above ``thr`` at ``[0, k - need)``, then the first
    ``need`` keys equal to it, each group in tensor order. Returns ``(dest, selected)``. One packed scan: the
    above-threshold count (< k <= 16384) in the low 15 bits, the tie count (<= 32768) above them."""
    gt = key > thr
    eq = (key == thr) & (take_all == 0)
    ranks = tl.cumsum(gt.to(tl.int32) + (eq.to(tl.int32) << 15), 0)
    n_gt = tl.sum(gt.to(tl.int32), 0)
    eq_rank = (ranks >> 15) - 1
    take = eq & (eq_rank < need)
    return tl.where(gt, (ranks & 0x7FFF) - 1, n_gt + eq_rank), gt | take


@triton.jit
def _topk_bisect_kernel(
    logits_ptr, stride_row, starts_ptr, ends_ptr, out_ptr, k,
    table_ptr, stride_table, batch_ptr, page_size, skip_ptr,
    WIDTH: tl.constexpr, BLOCK: tl.constexpr, FUSE: tl.constexpr, REG_WRITE: tl.constexpr = False,
    HAS_SKIP: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """One program per row: load the window ``[lo, hi)`` (``hi - lo <= WIDTH``) once, search, write ``[k]``.
    ``HAS_SKIP``: rows with ``skip_ptr[r] != 0`` (written by another search) are left alone. ``PDL``: launched
    as a programmatic dependent launch (:mod:`.pdl`)."""
    grid_sync(PDL)
    r = tl.program_id(0)
    if row_wanted(skip_ptr, r, HAS_SKIP):
        _bisect_row(logits_ptr, stride_row, starts_ptr, ends_ptr, out_ptr, k, table_ptr, stride_table, batch_ptr,
                    page_size, r, WIDTH, BLOCK, FUSE, REG_WRITE)


@triton.jit
def row_wanted(skip_ptr, r, HAS_SKIP: tl.constexpr):
    """Whether program row ``r`` has work: always without ``HAS_SKIP``, else when ``skip_ptr[r] == 0`` (another
    search has not written it). One call site for the row body, so it is inlined once, not once per branch."""
    if HAS_SKIP:
        wanted = tl.load(skip_ptr + r) == 0
    else:
        wanted = tl.full([], 1, tl.int1)
    return wanted


@triton.jit
def _bisect_row(logits_ptr, stride_row, starts_ptr, ends_ptr, out_ptr, k, table_ptr, stride_table, batch_ptr,
                page_size, r, WIDTH: tl.constexpr, BLOCK: tl.constexpr, FUSE: tl.constexpr, REG_WRITE: tl.constexpr):
    """Row ``r`` of :func:`_topk_bisect_kernel`."""
    row_ptr = logits_ptr + r.to(tl.int64) * stride_row
    lo = tl.load(starts_ptr + r).to(tl.int32)
    hi = tl.load(ends_ptr + r).to(tl.int32)
    out_row = out_ptr + r.to(tl.int64) * k
    table_row = page_table_row(table_ptr, stride_table, batch_ptr, r, FUSE)
    n = hi - lo
    cols = lo + tl.arange(0, WIDTH)
    inside = cols < hi
    # Only the keys stay live in registers: padding folds into them as INT_MIN (radix_key never yields it).
    key = tl.where(inside, radix_key(tl.load(row_ptr + cols, mask=inside, other=0.0)), -2147483648)
    thr, take_all, need = threshold(key, n, k)  # thr INT_MIN for a take-all row: every key is "above"
    if REG_WRITE:  # one scan over the registers instead of a chunked pass over memory
        dest, sel = rank_selected(key, thr, take_all, need)
        val = cols - lo
        if FUSE:
            val = to_slots(val, table_row, page_size, sel)
        tl.store(out_row + dest, val, mask=sel)
    else:
        offs = tl.arange(0, BLOCK)
        zero = tl.zeros([], dtype=tl.int32)
        c_gt = zero
        c_eq = zero
        for c0 in range(lo, hi, BLOCK):
            c_gt, c_eq = write_block(row_ptr, out_row, c0 + offs, hi, lo, zero, thr, take_all, need, k - need,
                                     c_gt, c_eq, table_row, page_size, FUSE)
    fill_tail(out_row, tl.minimum(n, k), k, -1, BLOCK)


def launch_bisect(logits, starts, ends, out, k, table, batch, page_size, *, block: int = 1024,
                  keys_per_thread: int = 0, warps: int = 0, reg_write: bool = True, skip=None,
                  pdl: bool = False) -> None:
    """One program per row over ``[R, L]`` logits with ``L <= MAX_WIDTH`` (``table``/``batch`` None: positions,
    else slots). ``warps`` 0: :func:`bisect_warps`; ``reg_write``: the final pass is one scan over the keys in
    registers instead of a chunked pass over the row in memory; ``skip`` (int32 ``[R]``, optional): rows marked
    non-zero are already written and left alone; ``pdl``: a programmatic dependent launch (:mod:`.pdl`; the
    caller checks the device supports it)."""
    width = logits.shape[1]
    if width > MAX_WIDTH:
        raise ValueError(f"rows of {width} columns do not fit one program (at most {MAX_WIDTH})")
    block_width = bisect_width(width)
    table, stride_table, batch, page_size, fuse = table_args(out, starts, table, batch, page_size)
    _topk_bisect_kernel[(logits.shape[0],)](
        logits, logits.stride(0), starts, ends, out, k, table, stride_table, batch, page_size,
        starts if skip is None else skip,
        WIDTH=block_width, BLOCK=min(block, block_width), FUSE=fuse, REG_WRITE=reg_write, HAS_SKIP=skip is not None,
        PDL=pdl, num_warps=warps or bisect_warps(block_width, keys_per_thread), **pdl_kwargs(pdl),
    )
