"""The online-softmax pieces every sparse MLA kernel shares (bf16 prefill/decode, pipelined, FP8 decode).

Scores are base 2 with the softmax scale folded in (``scale * log2(e)``); a row that has seen no valid index yet
keeps ``m = -inf`` and ``l = 0`` without producing NaNs, and finishes as zeros with ``lse = +inf`` (the
contract's empty query) or, for a split partial, ``lse = -inf`` (which the combine skips).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def softmax_block(s, valid, scale_log2, m_i, l_i):
    """Fold one block of raw scores ``s`` ``[BLOCK_H, BLOCK_N]`` (``valid`` ``[BLOCK_N]`` masks empty indices)
    into the running max ``m_i`` and sum ``l_i`` ``[BLOCK_H]``; returns ``(m_new, l_new, alpha, p)``: the caller
    rescales its accumulator by ``alpha`` and adds ``p @ V``."""
    s = tl.where(valid[None, :], s * scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing valid yet: keep exp2 away from nan
    alpha = tl.math.exp2(m_i - m_use)
    p = tl.math.exp2(s - m_use[:, None])
    return m_new, l_i * alpha + tl.sum(p, axis=1), alpha, p


@triton.jit
def finish_rows(acc, m_i, l_i):
    """``(out, lse, seen)``: ``acc / l`` (zeros where nothing was seen) and the natural-log ``lse`` of each row."""
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453
    return out, lse, seen
