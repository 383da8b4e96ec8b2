"""Grouped expert GEMMs over pairs sorted per expert (:mod:`.moe_align`), bf16 or FP8 with block scales.

Both kernels take one ``BLOCK_M`` block of pair rows (all of one expert) and one ``BLOCK_N`` column strip per
program; blocks past ``num_padded`` return at once, so the grid can be sized without a host sync. Only the
weights of experts that own a block are ever read: the same kernels are the decode path (``BLOCK_M`` 16).

* :func:`gemm_up` computes ``h = silu(x @ w1.T) * (x @ w3.T)`` for 128 intermediate columns (gate and up
  tiles of the same columns in one program), the rows of ``x`` gathered through the pair -> token map. With
  FP8 weights the activations are e4m3 with per-128 scales, each ``K`` step's dot is scaled by
  ``s_x[row] * s_w[col]`` in fp32, and ``h`` is quantized again per (row, 128 columns) in the epilogue.
* :func:`gemm_down` computes ``y[pair] = weight[pair] * (h @ w2.T)`` into a per-pair buffer; :func:`combine`
  then sums each token's pairs in a fixed order (deterministic, no atomics).

``UPCAST`` (set only under ``TRITON_INTERPRET=1``) runs bf16 dots in fp32 and pre-rounds FP8 conversions: the
CPU interpreter of Triton 3.6 mis-computes bf16 ``tl.dot`` and e4m3 rounding carries. Expert ``num_experts`` (one past the routed ones) is the shared expert when ``HAS_SHARED``: its weights
come from their own tensors, so the routed stack is never copied.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsa_runtime.plugins.cuda_hopper.triton.moe_quant import fp8_quantize, fp8_scale


@triton.jit
def _pair_rows(sorted_pairs_ptr, block_expert_ptr, num_padded_ptr, pid_m, NUM_PAIRS, TK, TOPK,
               BLOCK_M: tl.constexpr):
    """Rows of block ``pid_m``: (live, expert, padded row offsets, pair ids, row valid, token of each row)."""
    num_padded = tl.load(num_padded_ptr)
    live = pid_m * BLOCK_M < num_padded
    e = tl.load(block_expert_ptr + pid_m)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_pairs_ptr + offs_m)
    row_ok = pair < NUM_PAIRS
    token = tl.where(pair < TK, pair // TOPK, pair - TK)
    token = tl.where(row_ok, token, 0)
    return live, e, offs_m, pair, row_ok, token


@triton.jit
def _tile(pid, num_n, num_blocks, GROUP_M: tl.constexpr):
    """Program -> (row block, column strip). Programs run in groups of ``GROUP_M`` row blocks that sweep the
    column strips together, so a weight strip is fetched from DRAM once per group and served from L2 to the
    group's other row blocks (most blocks of a group belong to one expert); ``GROUP_M`` 1 keeps the plain
    row-major order (a row block's strips side by side, its activations in L2)."""
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    size = tl.minimum(num_blocks - first_m, GROUP_M)
    local = pid % per_group
    return first_m + local % size, local // size


@triton.jit
def _swiglu_cols(a_rows, a_scale_ptr, token, row_ok, stride_as, wbase, sbase, stride_wn, stride_wsn, offs_n, K,
                 INTER, FP8: tl.constexpr, UPCAST: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """``silu(x @ w1[offs_n].T) * (x @ w3[offs_n].T)`` for the gathered rows, fp32, zero past ``INTER``."""
    n_ok = offs_n < INTER
    offs_k = tl.arange(0, BLOCK_K)
    g_cols = wbase + offs_n.to(tl.int64)[None, :] * stride_wn
    u_cols = wbase + (offs_n + INTER).to(tl.int64)[None, :] * stride_wn
    acc_g = tl.zeros((a_rows.shape[0], offs_n.shape[0]), tl.float32)
    acc_u = tl.zeros((a_rows.shape[0], offs_n.shape[0]), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kb = k0 // BLOCK_K
        kk = k0 + offs_k
        k_ok = (kk < K) | EVEN_K  # EVEN_K: K % BLOCK_K == 0, the mask folds away
        a = tl.load(a_rows + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        bg = tl.load(g_cols + kk[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0)
        bu = tl.load(u_cols + kk[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0)
        if FP8:  # BLOCK_K == 128: step kb is scale block kb
            sa = tl.load(a_scale_ptr + token * stride_as + kb, mask=row_ok, other=0.0)
            sg = tl.load(sbase + (offs_n // 128) * stride_wsn + kb, mask=n_ok, other=0.0)
            su = tl.load(sbase + ((offs_n + INTER) // 128) * stride_wsn + kb, mask=n_ok, other=0.0)
            acc_g += tl.dot(a, bg) * (sa[:, None] * sg[None, :])
            acc_u += tl.dot(a, bu) * (sa[:, None] * su[None, :])
        elif UPCAST:
            acc_g = tl.dot(a.to(tl.float32), bg.to(tl.float32), acc_g)
            acc_u = tl.dot(a.to(tl.float32), bu.to(tl.float32), acc_u)
        else:
            acc_g = tl.dot(a, bg, acc_g)
            acc_u = tl.dot(a, bu, acc_u)
    h = acc_g * tl.sigmoid(acc_g) * acc_u
    return tl.where(n_ok[None, :], h, 0.0)


@triton.jit(do_not_specialize=["NUM_PAIRS", "TK", "NUM_BLOCKS"])  # token counts: no recompiles
def gemm_up(
    a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, ws_ptr, ws_scale_ptr, h_ptr, h_scale_ptr,
    sorted_pairs_ptr, block_expert_ptr, num_padded_ptr,
    NUM_PAIRS, TK, TOPK, K, INTER, NUM_EXPERTS, NUM_BLOCKS,
    stride_a, stride_as, stride_we, stride_wn, stride_wse, stride_wsn, stride_h, stride_hs,
    FP8: tl.constexpr, UE8M0: tl.constexpr, HAS_SHARED: tl.constexpr, UPCAST: tl.constexpr,
    QUANT_H: tl.constexpr, EVEN_K: tl.constexpr, SPLIT_N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """``SPLIT_N``: the program's ``BLOCK_N`` columns are computed in two half-width passes over K (half the
    accumulator registers per pass, so more warps' worth of pipelining fits), then quantized together."""
    pid_m, pid_n = _tile(tl.program_id(0), tl.cdiv(INTER, BLOCK_N), NUM_BLOCKS, GROUP_M)
    live, e, offs_m, pair, row_ok, token = _pair_rows(
        sorted_pairs_ptr, block_expert_ptr, num_padded_ptr, pid_m, NUM_PAIRS, TK, TOPK, BLOCK_M)
    if live:
        if HAS_SHARED and e == NUM_EXPERTS:
            wbase = ws_ptr
            sbase = ws_scale_ptr
        else:
            wbase = w_ptr + e.to(tl.int64) * stride_we
            sbase = w_scale_ptr + e.to(tl.int64) * stride_wse
        a_rows = a_ptr + token.to(tl.int64)[:, None] * stride_a
        out_rows = offs_m.to(tl.int64)[:, None] * stride_h
        if SPLIT_N:
            offs0 = pid_n * BLOCK_N + tl.arange(0, BLOCK_N // 2)
            offs1 = offs0 + BLOCK_N // 2
            h0 = _swiglu_cols(a_rows, a_scale_ptr, token, row_ok, stride_as, wbase, sbase, stride_wn, stride_wsn,
                              offs0, K, INTER, FP8, UPCAST, EVEN_K, BLOCK_K)
            h1 = _swiglu_cols(a_rows, a_scale_ptr, token, row_ok, stride_as, wbase, sbase, stride_wn, stride_wsn,
                              offs1, K, INTER, FP8, UPCAST, EVEN_K, BLOCK_K)
            if QUANT_H:  # BLOCK_N == 128: this program owns scale block pid_n of every row
                s = fp8_scale(tl.maximum(tl.max(tl.abs(h0), axis=1), tl.max(tl.abs(h1), axis=1)), UE8M0)
                h0 = fp8_quantize(h0, s[:, None], UPCAST)
                h1 = fp8_quantize(h1, s[:, None], UPCAST)
                tl.store(h_scale_ptr + offs_m * stride_hs + pid_n, s)
            tl.store(h_ptr + out_rows + offs0[None, :], h0.to(h_ptr.dtype.element_ty), mask=(offs0 < INTER)[None, :])
            tl.store(h_ptr + out_rows + offs1[None, :], h1.to(h_ptr.dtype.element_ty), mask=(offs1 < INTER)[None, :])
        else:
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            n_ok = offs_n < INTER
            h = _swiglu_cols(a_rows, a_scale_ptr, token, row_ok, stride_as, wbase, sbase, stride_wn, stride_wsn,
                             offs_n, K, INTER, FP8, UPCAST, EVEN_K, BLOCK_K)
            if QUANT_H:  # BLOCK_N == 128: this program owns scale block pid_n of every row
                s = fp8_scale(tl.max(tl.abs(h), axis=1), UE8M0)
                tl.store(h_ptr + out_rows + offs_n[None, :], fp8_quantize(h, s[:, None], UPCAST),
                         mask=n_ok[None, :])
                tl.store(h_scale_ptr + offs_m * stride_hs + pid_n, s)
            else:
                tl.store(h_ptr + out_rows + offs_n[None, :], h.to(h_ptr.dtype.element_ty), mask=n_ok[None, :])


@triton.jit(do_not_specialize=["NUM_PAIRS", "TK", "NUM_BLOCKS"])  # token counts: no recompiles
def gemm_down(
    h_ptr, h_scale_ptr, w_ptr, w_scale_ptr, ws_ptr, ws_scale_ptr, y_ptr, topk_w_ptr,
    sorted_pairs_ptr, block_expert_ptr, num_padded_ptr,
    NUM_PAIRS, TK, TOPK, K, N, NUM_EXPERTS, NUM_BLOCKS,
    stride_h, stride_hs, stride_we, stride_wn, stride_wse, stride_wsn, stride_y,
    FP8: tl.constexpr, HAS_SHARED: tl.constexpr, UPCAST: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid_m, pid_n = _tile(tl.program_id(0), tl.cdiv(N, BLOCK_N), NUM_BLOCKS, GROUP_M)
    live, e, offs_m, pair, row_ok, token = _pair_rows(
        sorted_pairs_ptr, block_expert_ptr, num_padded_ptr, pid_m, NUM_PAIRS, TK, TOPK, BLOCK_M)
    if live:
        if HAS_SHARED and e == NUM_EXPERTS:
            wbase = ws_ptr
            sbase = ws_scale_ptr
        else:
            wbase = w_ptr + e.to(tl.int64) * stride_we
            sbase = w_scale_ptr + e.to(tl.int64) * stride_wse
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        offs_k = tl.arange(0, BLOCK_K)
        a_rows = h_ptr + offs_m.to(tl.int64)[:, None] * stride_h
        b_cols = wbase + offs_n.to(tl.int64)[None, :] * stride_wn
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kb = k0 // BLOCK_K
            kk = k0 + offs_k
            k_ok = (kk < K) | EVEN_K  # EVEN_K: K % BLOCK_K == 0, the mask folds away
            a = tl.load(a_rows + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_cols + kk[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0)
            if FP8:
                sa = tl.load(h_scale_ptr + offs_m * stride_hs + kb, mask=row_ok, other=0.0)
                sb = tl.load(sbase + (offs_n // 128) * stride_wsn + kb, mask=n_ok, other=0.0)
                acc += tl.dot(a, b) * (sa[:, None] * sb[None, :])
            elif UPCAST:
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
            else:
                acc = tl.dot(a, b, acc)
        wt = tl.load(topk_w_ptr + pair, mask=row_ok & (pair < TK), other=1.0)
        acc = acc * wt[:, None]
        y_rows = y_ptr + tl.where(row_ok, pair, 0).to(tl.int64)[:, None] * stride_y
        tl.store(y_rows + offs_n[None, :], acc.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["T"])
def combine(y_ptr, ids_ptr, out_ptr, extra_ptr, T, N, NUM_EXPERTS, stride_y, stride_out, stride_extra,
            TOPK: tl.constexpr, SHARED_ROWS: tl.constexpr, HAS_EXTRA: tl.constexpr, BLOCK_N: tl.constexpr):
    """``out[t] = sum_j [0 <= ids[t, j] < E] y[t*k + j] (+ y[T*k + t] when the shared expert rode along)
    (+ extra[t] when it ran apart)``, fp32 sums, stored in out's dtype. Pairs with an id outside ``[0, E)`` were never
    computed, so their ``y`` rows are never read."""
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = offs < N
    acc = tl.zeros((BLOCK_N,), tl.float32)
    for j in tl.static_range(TOPK):
        e = tl.load(ids_ptr + t * TOPK + j)
        if (e >= 0) & (e < NUM_EXPERTS):
            acc += tl.load(y_ptr + (t * TOPK + j).to(tl.int64) * stride_y + offs, mask=ok, other=0.0).to(tl.float32)
    if SHARED_ROWS:
        acc += tl.load(y_ptr + (T * TOPK + t).to(tl.int64) * stride_y + offs, mask=ok, other=0.0).to(tl.float32)
    if HAS_EXTRA:
        acc += tl.load(extra_ptr + t.to(tl.int64) * stride_extra + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t.to(tl.int64) * stride_out + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def combine_sorted(y_ptr, pos_ptr, w_ptr, ys_ptr, pos_s_ptr, out_ptr, N, stride_y, stride_ys, stride_out,
                   TOPK: tl.constexpr, HAS_SHARED: tl.constexpr, BLOCK_N: tl.constexpr):
    """``out[t] = sum_j w[t, j] * y[pos[t, j]] (+ ys[pos_s[t]])`` for rows computed in expert-sorted order
    (another library's grouped GEMM): ``pos`` ``-1`` for a pair that was not computed (its row is never read).
    fp32 sums in a fixed order (deterministic), stored in out's dtype."""
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = offs < N
    acc = tl.zeros((BLOCK_N,), tl.float32)
    for j in tl.static_range(TOPK):
        p = tl.load(pos_ptr + t * TOPK + j)
        if p >= 0:
            wt = tl.load(w_ptr + t * TOPK + j)
            acc += wt * tl.load(y_ptr + p.to(tl.int64) * stride_y + offs, mask=ok, other=0.0).to(tl.float32)
    if HAS_SHARED:
        p = tl.load(pos_s_ptr + t)
        acc += tl.load(ys_ptr + p.to(tl.int64) * stride_ys + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t.to(tl.int64) * stride_out + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)
