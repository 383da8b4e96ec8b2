"""Exact top-k of long rows from a sampled lower bound: one read of the row, few candidates (Triton).

The register search of :mod:`.topk_bisect_split` takes every slice's own top-k and merges them, so a 128K row
cut into four 32K slices searches 4 x 32K keys bit by bit and merges 8K candidates, where the answer is 2K of
128K. Here a cheap bound does the cutting instead:

1. **Sample** (one program per row, or in every scan program with ``fused_sample``): ``SAMPLE`` keys in
   ``CHUNK``-column runs spread evenly over the window. Its ``j``-th largest key, ``j`` about
   ``k * SAMPLE / n`` plus ``sigmas`` standard deviations, is a lower bound ``t`` that at least ``k`` keys of
   the row reach unless the sample is unrepresentative (a window that fits the sample is read whole and
   ``j = k``: ``t`` is then the exact k-th key).
2. **Scan** (``S`` programs per row): every key ``>= t`` of a slice goes, with its column, to that slice's part
   of a candidate buffer in column order (a per-chunk ``tl.cumsum``, no atomics), and the slice's count to
   ``[R, S]``.
3. **Finish** (one program per row): when ``k <= m <= CAP`` (``m`` the row's candidates) and no slice
   overflowed its part, the candidates are gathered in column order into registers and searched bit by bit
   (:func:`.topk_bisect.threshold`); the row is marked done. Take-all windows (``n <= k``) are written here too.

Why it is exact: every key of the row's top-k is ``>= t`` whenever at least ``k`` keys are, so the candidates
hold the whole answer, and they are in column order, so ties at the threshold go to the lower column as in the
reference. A row that is not done (the bound missed: fewer than ``k`` candidates, or more than the buffer;
heavy ties, ``-inf`` floods; a sample that already shows the overflow skips the scan of its row) is left to
the caller's fallback search, whose kernels skip done rows
(``skip_ptr`` of :mod:`.topk_bisect` / :mod:`.topk_bisect_split`): the cost of a miss is that search's, never a
wrong answer. Nothing syncs with the host and every buffer is sized by shapes: CUDA-graph capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsa_runtime.plugins.cuda_hopper.triton.pdl import grid_sync, pdl_enabled, pdl_kwargs
from dsa_runtime.plugins.cuda_hopper.triton.topk import SamplePlan
from dsa_runtime.plugins.cuda_hopper.triton.topk_bisect import fill_tail, kth_key, rank_selected, threshold
from dsa_runtime.plugins.cuda_hopper.triton.topk_radix import page_table_row, radix_key, table_args, to_slots

INT_MIN = tl.constexpr(-2147483648)
SKIP = tl.constexpr(2147483647)  # a bound no key reaches (radix_key's largest is +inf's, 0x7F800000)


def sample_slices(rows: int, width: int, sms: int, min_slice: int = 4096, max_slice: int = 16384,
                  most: int = 64, per_sm: int = 4) -> int:
    """Scan programs per row: a power of two giving slices of at most ``max_slice`` columns (a program's chunks
    are read one after another: many rows must not leave one program a whole 128K row), then doubled while the
    rows give fewer than about ``per_sm`` programs per SM and slices stay at least ``min_slice`` wide; at most
    ``most``. H200 sweeps: the Triton scan (4 per SM) at 64 x 128K 8 slices 0.062 ms, 4 0.073, 16 0.063, at
    1 x 128K 32 slices 0.040, 8 0.048; the CUDA scan (8 per SM, its programs are smaller) at 64 x 128K 16 slices
    0.0506-0.0516 ms against 0.0516-0.0544 for 8 (three runs), at 256 rows 8 slices either way."""
    s = 1
    while width > s * max_slice and s * 2 <= most:
        s *= 2
    while rows * s * 2 <= per_sm * sms and width // (s * 2) >= min_slice and s * 2 <= most:
        s *= 2
    return s


@triton.jit
def sample_bound(row_ptr, lo, hi, k, sigmas, cap, SAMPLE: tl.constexpr, CHUNK: tl.constexpr):
    """The lower bound ``t`` of columns ``[lo, hi)`` (``n = hi - lo > k``): the ``j``-th largest sampled key.
    Runs of ``CHUNK`` columns every ``step >= CHUNK`` columns; when ``n <= SAMPLE`` the window is read whole and
    ``j = k``. ``INT_MIN`` (every key a candidate) when the sample holds no more than ``j`` keys. :data:`SKIP`
    when the keys ``>= t`` in the sample, scaled to the window, exceed ``cap`` (ties or ``-inf`` floods at the
    bound): the row would overflow the buffer, so the scan does not read it and the fallback takes it."""
    NCH: tl.constexpr = SAMPLE // CHUNK
    n = hi - lo
    step = tl.maximum((n + NCH - 1) // NCH, CHUNK)
    i = tl.arange(0, SAMPLE)
    cols = lo + (i // CHUNK) * step + (i % CHUNK)
    inside = cols < hi
    key = tl.where(inside, radix_key(tl.load(row_ptr + cols, mask=inside, other=0.0)), INT_MIN)
    ns = tl.sum(inside.to(tl.int32), 0)
    expect = ns.to(tl.float32) * k / tl.maximum(n, 1).to(tl.float32)
    j = (expect + sigmas * tl.sqrt(expect)).to(tl.int32) + 2
    j = tl.where(ns == n, k, tl.minimum(j, ns))
    live = ns > j
    t = tl.where(live, kth_key(key, tl.maximum(j, 1), live), INT_MIN)
    reach = tl.sum((key >= t).to(tl.int32), 0).to(tl.float32) * n.to(tl.float32) / tl.maximum(ns, 1).to(tl.float32)
    return tl.where(reach > cap, SKIP, t)


@triton.jit
def _sample_kernel(logits_ptr, stride_row, starts_ptr, ends_ptr, bound_ptr, k, sigmas, cap,
                   SAMPLE: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr = False):
    grid_sync(PDL)
    r = tl.program_id(0)
    lo = tl.load(starts_ptr + r).to(tl.int32)
    hi = tl.load(ends_ptr + r).to(tl.int32)
    t = tl.full([], INT_MIN, tl.int32)
    if hi - lo > k:
        t = sample_bound(logits_ptr + r.to(tl.int64) * stride_row, lo, hi, k, sigmas, cap, SAMPLE, CHUNK)
    tl.store(bound_ptr + r, t)


@triton.jit
def _scan_kernel(logits_ptr, stride_row, starts_ptr, ends_ptr, bound_ptr, cnt_ptr, ckey_ptr, ccol_ptr,
                 k, S, CAPS, sigmas, cap,
                 SAMPLE: tl.constexpr, CHUNK: tl.constexpr, FUSED: tl.constexpr, BLOCK: tl.constexpr,
                 STAGES: tl.constexpr = 1, PDL: tl.constexpr = False):
    """Program ``(r, s)``: the keys ``>= t`` of slice ``s`` and their columns to ``[r, s, :CAPS]`` in column
    order (none past ``CAPS``), the slice's full count to ``cnt[r, s]``."""
    grid_sync(PDL)
    r = tl.program_id(0)
    s = tl.program_id(1)
    lo = tl.load(starts_ptr + r).to(tl.int32)
    hi = tl.load(ends_ptr + r).to(tl.int32)
    row_ptr = logits_ptr + r.to(tl.int64) * stride_row
    cnt = tl.zeros([], dtype=tl.int32)
    if hi - lo > k:
        if FUSED:
            t = sample_bound(row_ptr, lo, hi, k, sigmas, cap, SAMPLE, CHUNK)
        else:
            t = tl.load(bound_ptr + r)
        per = (hi - lo + S - 1) // S
        a = tl.minimum(lo + s * per, hi)
        c = tl.where(t == SKIP, a, tl.minimum(a + per, hi))  # SKIP: nothing read, the row's count stays 0
        base = (r.to(tl.int64) * S + s) * CAPS
        offs = tl.arange(0, BLOCK)
        for c0 in tl.range(a, c, BLOCK, num_stages=STAGES):
            cols = c0 + offs
            inside = cols < c
            key = radix_key(tl.load(row_ptr + cols, mask=inside, other=0.0))
            sel = inside & (key >= t)
            dest = cnt + tl.cumsum(sel.to(tl.int32), 0) - 1
            keep = sel & (dest < CAPS)
            tl.store(ckey_ptr + base + dest, key, mask=keep)
            tl.store(ccol_ptr + base + dest, cols, mask=keep)
            cnt += tl.sum(sel.to(tl.int32), 0)
    tl.store(cnt_ptr + r * S + s, cnt)


@triton.jit
def _finish_kernel(starts_ptr, ends_ptr, cnt_ptr, ckey_ptr, ccol_ptr, out_ptr, done_ptr, k, S, CAPS,
                   table_ptr, stride_table, batch_ptr, page_size,
                   CAP: tl.constexpr, SP: tl.constexpr, BLOCK: tl.constexpr, FUSE: tl.constexpr,
                   PDL: tl.constexpr = False):
    """Program ``r``: the row's ``[k]`` output from its candidates when they hold the answer (``done[r] = 1``),
    or from the window itself when ``n <= k``; else nothing is written (``done[r] = 0``)."""
    grid_sync(PDL)
    r = tl.program_id(0)
    lo = tl.load(starts_ptr + r).to(tl.int32)
    hi = tl.load(ends_ptr + r).to(tl.int32)
    n = hi - lo
    out_row = out_ptr + r.to(tl.int64) * k
    table_row = page_table_row(table_ptr, stride_table, batch_ptr, r, FUSE)
    done = tl.zeros([], dtype=tl.int32)
    if n <= k:  # take-all: positions 0..n-1, then -1
        offs = tl.arange(0, BLOCK)
        for c0 in range(0, tl.maximum(n, 0), BLOCK):
            pos = c0 + offs
            inside = pos < n
            val = pos
            if FUSE:
                val = to_slots(val, table_row, page_size, inside)
            tl.store(out_row + pos, val, mask=inside)
        fill_tail(out_row, tl.maximum(n, 0), k, -1, BLOCK)
        done = tl.full([], 1, tl.int32)
    else:
        sidx = tl.arange(0, SP)
        cnts = tl.load(cnt_ptr + r * S + sidx, mask=sidx < S, other=0)
        m = tl.sum(cnts, 0)
        if (m >= k) & (m <= CAP) & (tl.max(cnts, 0) <= CAPS):
            # Candidate i of the row is slice j's (i - pre) when pre <= i < pre + cnt[j], pre the candidates of the
            # slices before j: a running sum of scalar loads (two block-wide sums per slice cost more).
            i = tl.arange(0, CAP)
            src = tl.zeros([CAP], dtype=tl.int32)
            pre = tl.zeros([], dtype=tl.int32)
            for j in range(0, S):
                cj = tl.load(cnt_ptr + r * S + j)
                src = tl.where((i >= pre) & (i < pre + cj), j * CAPS + i - pre, src)
                pre += cj
            valid = i < m
            base = r.to(tl.int64) * S * CAPS
            key = tl.load(ckey_ptr + base + src, mask=valid, other=INT_MIN)
            thr, take_all, need = threshold(key, m, k)
            dest, sel = rank_selected(key, thr, take_all, need)
            val = tl.load(ccol_ptr + base + src, mask=sel, other=0) - lo
            if FUSE:
                val = to_slots(val, table_row, page_size, sel)
            tl.store(out_row + dest, val, mask=sel)
            done = tl.full([], 1, tl.int32)
    tl.store(done_ptr + r, done)


def uses_cuda_scan(plan: SamplePlan, logits: torch.Tensor) -> bool:
    """Whether the scan runs as CUDA C++ (:mod:`...cuda.topk_scan`): asked for, a separate sample launch (the
    CUDA scan reads the bound), and the kernel usable on these logits."""
    if not plan.cuda_scan or plan.fused_sample or not logits.is_cuda:
        return False
    from dsa_runtime.plugins.cuda_hopper.cuda.topk_scan import usable

    return usable(logits)


def launch_sample(logits, starts, ends, out, k, table, batch, page_size, *, plan: SamplePlan,
                  cuda_scan: bool | None = None) -> torch.Tensor:
    """Steps 1-3 over ``[R, L]`` fp32 logits into ``out`` ``[R, k]``; returns ``done`` (int32 ``[R]``, 1 where the
    row is written) for the fallback's ``skip_ptr``. ``cuda_scan``: the caller's :func:`uses_cuda_scan` answer for
    these logits (asked here when ``None``)."""
    rows, width = logits.shape
    if plan.slices < 1:
        raise ValueError(f"plan.slices must be resolved (>= 1), got {plan.slices}: see sample_slices")
    S = plan.slices
    if plan.cap & (plan.cap - 1) or plan.sample & (plan.sample - 1) or plan.sample % plan.chunk:
        raise ValueError(f"cap {plan.cap} and sample {plan.sample} must be powers of two, chunk {plan.chunk} dividing it")
    if k > plan.cap:
        raise ValueError(f"k {k} exceeds the candidate buffer ({plan.cap})")
    caps = max(1, min(plan.cap, -(-width // S)))
    dev = logits.device
    ws = torch.empty(rows * (2 + S + 2 * S * caps), dtype=torch.int32, device=dev)
    bound, done = ws[:rows], ws[rows:2 * rows]
    cnt = ws[2 * rows:rows * (2 + S)]
    cand = ws[rows * (2 + S):].view(2, rows, S, caps)
    pdl = pdl_enabled(plan.pdl, dev)
    if not plan.fused_sample:
        _sample_kernel[(rows,)](logits, logits.stride(0), starts, ends, bound, k, plan.sigmas, plan.cap,
                                SAMPLE=plan.sample, CHUNK=plan.chunk, PDL=pdl, num_warps=plan.sample_warps,
                                **pdl_kwargs(pdl))
    if cuda_scan is None:
        cuda_scan = uses_cuda_scan(plan, logits)
    if cuda_scan:
        from dsa_runtime.plugins.cuda_hopper.cuda.topk_scan import launch_scan

        launch_scan(logits, starts, ends, bound, cnt, cand[0], cand[1], k, S, caps, plan.cuda_round, pdl=pdl,
                    threads=plan.cuda_threads)
    else:
        _scan_kernel[(rows, S)](
            logits, logits.stride(0), starts, ends, bound, cnt, cand[0], cand[1], k, S, caps, plan.sigmas, plan.cap,
            SAMPLE=plan.sample, CHUNK=plan.chunk, FUSED=plan.fused_sample, BLOCK=plan.block, STAGES=plan.stages,
            PDL=pdl, num_warps=max(plan.warps, plan.sample_warps) if plan.fused_sample else plan.warps,
            **pdl_kwargs(pdl),
        )
    tab, stab, bat, ps, fuse = table_args(out, starts, table, batch, page_size)
    _finish_kernel[(rows,)](
        starts, ends, cnt, cand[0], cand[1], out, done, k, S, caps, tab, stab, bat, ps,
        CAP=plan.cap, SP=triton.next_power_of_2(S), BLOCK=1024, FUSE=fuse, PDL=pdl, num_warps=plan.finish_warps,
        **pdl_kwargs(pdl),
    )
    return done
