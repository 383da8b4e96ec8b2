"""FP8 (``fp8_656``) sparse MLA decode, pipelined variant ("pipe"): the contract, arguments and outputs of
``_decode_kernel`` in :mod:`.mla_fp8_decode`, restructured for SM90.

* **Index prefetch**: the slots of block ``i + 1`` are loaded (loop-carried) before block ``i`` is gathered, so
  the 656-byte row gathers never wait on an index load inside the iteration.
* **Grid order** ``(head block, query, split)``: with 128 heads the two 64-head programs of a query gather the
  same rows; launched next to each other, the second finds them in L2 (with the query fastest, at batch 128 they
  fell into different waves).
* **One multiply per element to dequantize**: e4m3 -> bf16 is exact and the cache's scales are powers of two
  (ue8m0, always, for this layout), so ``c8.to(bf16) * scale.to(bf16)`` is exact and equals the fp32 route of
  the plain kernel bit for bit, with one bf16 multiply instead of two conversions and an fp32 multiply.
  (Under ``TRITON_INTERPRET=1`` the fp32 route runs instead: the interpreter cannot multiply bf16 tensors. The
  GPU bench checks the bf16 route of every candidate against the reference.)
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsa_runtime.plugins.cuda_hopper.triton.mla_fp8_decode import attend_block, store_result


@triton.jit
def _decode_pipe_kernel(q_ptr, c8_ptr, s32_ptr, pe16_ptr, idx_ptr, out_ptr, lse_ptr,
                        H, K, K_PER_SPLIT, qk_scale,
                        stride_qm, stride_qh, stride_im, stride_om, stride_os, stride_oh, stride_lm, stride_ls,
                        D_OUT: tl.constexpr, SPLIT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                        UPCAST: tl.constexpr):
    hb = tl.program_id(0)  # head blocks of one query are adjacent programs: the second reads its rows from L2
    m = tl.program_id(1).to(tl.int64)
    sp = tl.program_id(2)
    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = h < H
    d = tl.arange(0, 512)
    dp = tl.arange(0, 64)
    j = tl.arange(0, 4)
    t = tl.arange(0, 128)
    q_row = q_ptr + m * stride_qm + h[:, None] * stride_qh
    q_c = tl.load(q_row + d[None, :], mask=hmask[:, None], other=0.0)
    q_pe = tl.load(q_row + 512 + dp[None, :], mask=hmask[:, None], other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, 512], tl.float32)
    lo = sp * K_PER_SPLIT
    hi = tl.minimum(lo + K_PER_SPLIT, K)
    offs_n = tl.arange(0, BLOCK_N)
    idx_row = idx_ptr + m * stride_im
    slot_next = tl.load(idx_row + lo + offs_n, mask=lo + offs_n < hi, other=-1)
    for n0 in range(lo, hi, BLOCK_N):
        slot = slot_next
        nxt = n0 + BLOCK_N + offs_n
        slot_next = tl.load(idx_row + nxt, mask=nxt < hi, other=-1)  # issued before this block's gathers
        valid = slot >= 0
        row = tl.where(valid, slot, 0).to(tl.int64)
        c8 = tl.load(c8_ptr + row[:, None, None] * 656 + j[None, :, None] * 128 + t[None, None, :],
                     mask=valid[:, None, None], other=0.0)
        sc = tl.load(s32_ptr + row[:, None] * 164 + 128 + j[None, :], mask=valid[:, None], other=0.0)
        if UPCAST:  # the interpreter keeps bf16 as raw bits and cannot multiply them: the exact fp32 route
            c = tl.reshape((c8.to(tl.float32) * sc[:, :, None]).to(tl.bfloat16), (BLOCK_N, 512))
        else:
            c = tl.reshape(c8.to(tl.bfloat16) * sc.to(tl.bfloat16)[:, :, None], (BLOCK_N, 512))
        pe = tl.load(pe16_ptr + row[:, None] * 328 + 264 + dp[None, :], mask=valid[:, None], other=0.0)
        m_i, l_i, acc = attend_block(q_c, q_pe, c, pe, valid, qk_scale, m_i, l_i, acc, UPCAST)

    store_result(out_ptr, lse_ptr, m, sp, h, hmask, acc, m_i, l_i,
                 stride_om, stride_os, stride_oh, stride_lm, stride_ls, D_OUT, SPLIT)
