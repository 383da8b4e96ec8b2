"""Sparse MLA attention (absorbed / MQA form) for the ``torch`` backend: batched GEMMs, two strategies.

* **gather** (decode, and prefill over long buffers or in a float32 model): the selected rows are gathered
  once per chunk of queries (``index_select``) into ``[m, K, 576]`` and both products are batched ``bmm``
  calls; ``P @ V`` in bf16 for bf16 queries over at least ``BF16_MIN_ROWS`` rows, else fp32.
* **dense-then-select** (bf16 prefill when the buffer has at most ``DENSE_FACTOR * K`` rows): one GEMM scores every
  query against every row, the selected scores are gathered, and the probabilities are scattered back
  (``scatter_add``: duplicate indices each count) into a dense ``[T * H, S]`` matrix for a second GEMM.
  Used only when every row of the buffer is finite, since unselected rows enter the GEMMs (times 0).

Scores and the log-sum-exp are fp32 (the lse tolerance is 1e-4 relative); rows that a ``-1`` index stands in
for are zeroed before any product, so poisoned (NaN) rows never leak through ``0 * NaN``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.families import D_QK, D_V, FP8_MLA_ROW_BYTES, MLALayout
from dsa_runtime.torch_kernels.mla_rows import rows_to_float

CHUNK_ELEMENTS = 1 << 23  # fp32 elements of one gathered [m, K, 576] block or dense [m, H, S] score block
DENSE_FACTOR = 4
BF16_MIN_ROWS = 512  # gathered rows from which the bf16 P @ V product beats fp32


def _finish(scores: Tensor, valid: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """Masked softmax pieces of ``scores`` ``[m, H, K]`` fp32 (``valid`` ``[m, K]``, None when all are).

    Returns unnormalised probabilities ``p`` (0 where invalid), their row sums ``denom`` ``[m, H, 1]`` (>= 1
    where any key is valid, clamped away from 0 elsewhere) and ``lse`` ``[m, H]`` (``+inf`` for empty rows).
    """
    if valid is not None:
        scores = scores.masked_fill_(~valid[:, None, :], float("-inf"))
    peak = scores.amax(dim=-1, keepdim=True)
    empty = None
    if valid is not None:
        empty = peak == float("-inf")
        peak = peak.masked_fill(empty, 0.0)
    p = torch.exp_(scores.sub_(peak))
    denom = p.sum(dim=-1, keepdim=True)
    lse = (denom.log() + peak).squeeze(-1)
    if empty is not None:
        lse.masked_fill_(empty.squeeze(-1), float("inf"))
        denom.clamp_min_(1e-30)
    return p, denom, lse


def _gather_attend(q: Tensor, rows: Tensor, valid: Tensor | None, sm_scale: float, d_v: int) -> tuple[Tensor, Tensor]:
    """q ``[m, H, 576]`` fp32, gathered rows ``[m, K, 576]`` bf16 or fp32 (zero where invalid) -> out, lse.

    Scores in fp32. With bf16 rows (and a bf16 query: a float32 model keeps fp32) the ``P @ V`` product runs
    in bf16 (normalised ``P`` rounded once, fp32 accumulation inside the GEMM, ~2.5x faster than fp32 on CPUs
    with AVX512-BF16), well inside the ``sparse_attn.out`` tolerance; the full 576-wide rows are used
    because a sliced operand is slower. Below ``BF16_MIN_ROWS`` gathered rows (a small decode batch) the
    fp32 product is faster (a bf16 GEMM has a fixed cost of ~15 us on CPU).
    """
    rows_f = rows.float()
    scores = torch.bmm(q, rows_f.transpose(1, 2)).mul_(sm_scale)
    p, denom, lse = _finish(scores, valid)
    if rows.dtype == torch.bfloat16 and rows.shape[0] * rows.shape[1] >= BF16_MIN_ROWS:
        return torch.bmm(p.div_(denom).to(torch.bfloat16), rows)[..., :d_v].float(), lse
    return torch.bmm(p, rows_f[..., :d_v]).div_(denom), lse


def _gathered(q: Tensor, idx: Tensor, fetch, sm_scale: float, d_v: int) -> tuple[Tensor, Tensor]:
    """Gather strategy over chunks of queries: q ``[M, H, 576]``, idx ``[M, K]`` int64 (``-1`` empty)."""
    m_total, heads, _ = q.shape
    top_k = idx.shape[1]
    out = torch.empty(m_total, heads, d_v, dtype=torch.float32, device=q.device)
    lse = torch.empty(m_total, heads, dtype=torch.float32, device=q.device)
    chunk = max(1, CHUNK_ELEMENTS // (top_k * max(D_QK, heads)))
    for m0 in range(0, m_total, chunk):
        m1 = min(m0 + chunk, m_total)
        valid = idx[m0:m1] >= 0
        rows = fetch(idx[m0:m1].clamp_min(0))
        holes = (~valid).view(-1).nonzero().squeeze(1)
        if holes.numel():  # zero the stand-in rows (row 0 may be poison) before any product
            rows.view(-1, D_QK).index_fill_(0, holes, 0.0)
        if q.dtype != torch.bfloat16:
            rows = rows.float()
        out[m0:m1], lse[m0:m1] = _gather_attend(q[m0:m1].float(), rows, valid if holes.numel() else None,
                                                sm_scale, d_v)
    return out, lse


def _dense_select(q: Tensor, kv: Tensor, kv_in: Tensor, idx: Tensor, sm_scale: float,
                  d_v: int) -> tuple[Tensor, Tensor]:
    """Dense-then-select strategy: q ``[T, H, 576]``, kv ``[S, 576]`` fp32 (finite), idx ``[T, K]`` int64.

    ``kv_in`` is the caller's buffer; when it is bf16 the ``P @ V`` GEMM runs in bf16 on it (normalised
    probabilities rounded once), as in the gather strategy.
    """
    t_total, heads, _ = q.shape
    s_total = kv.shape[0]
    out = torch.empty(t_total, heads, d_v, dtype=torch.float32, device=q.device)
    lse = torch.empty(t_total, heads, dtype=torch.float32, device=q.device)
    kv_t = kv.T
    low = kv_in.dtype == torch.bfloat16 and q.dtype == torch.bfloat16
    values = kv_in[:, :d_v] if low else kv[:, :d_v]
    chunk = max(1, CHUNK_ELEMENTS // (heads * max(s_total, idx.shape[1])))
    for t0 in range(0, t_total, chunk):
        t1 = min(t0 + chunk, t_total)
        m = t1 - t0
        valid = idx[t0:t1] >= 0
        where = idx[t0:t1].clamp_min(0)[:, None, :].expand(m, heads, -1)
        full = (q[t0:t1].float().reshape(m * heads, D_QK) @ kv_t).view(m, heads, s_total)
        p, denom, lse[t0:t1] = _finish(torch.gather(full, 2, where).mul_(sm_scale),
                                       None if bool(valid.all()) else valid)
        probs = torch.zeros_like(full).scatter_add_(2, where, p.div_(denom))  # duplicates each contribute
        probs = probs.view(m * heads, s_total)
        if low:
            probs = probs.to(torch.bfloat16)
        out[t0:t1] = (probs @ values).view(m, heads, d_v)
    return out, lse


def _check_indices(idx: Tensor, n_rows: int) -> None:
    if idx.numel() and (int(idx.min()) < -1 or int(idx.max()) >= n_rows):
        raise ValueError(f"sparse attention indices must be -1 or in [0, {n_rows})")


class TorchSparseAttn:
    """:class:`dsa_runtime.families.SparseAttnKernels` with batched GEMMs."""

    def prefill(
        self, q: Tensor, kv: Tensor, indices: Tensor, sm_scale: float, d_v: int = D_V
    ) -> tuple[Tensor, Tensor]:
        """q ``[T, H, 576]`` bf16, kv ``[S, 576]`` bf16, indices ``[T, K]`` -> out ``[T, H, d_v]`` bf16, lse ``[T, H]``."""
        if q.dim() != 3 or q.shape[-1] != D_QK or kv.dim() != 2 or kv.shape[-1] != D_QK:
            raise ValueError(
                f"expected q [T, H, 576] and kv [S, 576], got {tuple(q.shape)}, {tuple(kv.shape)}"
            )
        t_total, heads, _ = q.shape
        idx = indices.to(device=q.device, dtype=torch.int64)
        if idx.shape[1] == 0 or kv.shape[0] == 0 or t_total == 0:
            return (torch.zeros(t_total, heads, d_v, dtype=torch.bfloat16, device=q.device),
                    torch.full((t_total, heads), float("inf"), dtype=torch.float32, device=q.device))
        _check_indices(idx, kv.shape[0])
        # Dense-then-select only for bf16 queries: its sums run over every row of the buffer, whose length
        # changes with the prefill chunk, so a float32 model (the bit-reproducible verification mode) would
        # see chunk-dependent rounding; the gather strategy's sums depend only on the selection.
        dense = q.dtype == torch.bfloat16 and kv.shape[0] <= DENSE_FACTOR * idx.shape[1]
        kvf = kv.float() if dense else None
        if kvf is not None and bool(torch.isfinite(kvf).all()):
            out, lse = _dense_select(q, kvf, kv, idx, sm_scale, d_v)
        else:
            out, lse = _gathered(q, idx, lambda i: kv.index_select(0, i.reshape(-1)).view(*i.shape, D_QK),
                                 sm_scale, d_v)
        return out.to(torch.bfloat16), lse

    def decode(
        self,
        q: Tensor,
        kv_cache: Tensor,
        indices: Tensor,
        sm_scale: float,
        *,
        layout: MLALayout,
        d_v: int = D_V,
    ) -> tuple[Tensor, Tensor]:
        """q ``[B, Q, H, 576]``, paged cache, indices ``[B, Q, K]`` slots -> out ``[B, Q, H, d_v]`` bf16, lse."""
        if q.dim() != 4 or q.shape[-1] != D_QK or indices.shape[:2] != q.shape[:2]:
            raise ValueError(
                f"expected q [B, Q, H, 576] and indices [B, Q, K], got {tuple(q.shape)}, {tuple(indices.shape)}"
            )
        batch, n_q, heads, _ = q.shape
        width, dtype = (D_QK, torch.bfloat16) if layout == "bf16" else (FP8_MLA_ROW_BYTES, torch.uint8)
        if layout not in ("bf16", "fp8_656") or kv_cache.shape[-1] != width or kv_cache.dtype != dtype:
            raise ValueError(f"{layout} cache must be [pages, page_size, {width}] {dtype}, got "
                             f"{tuple(kv_cache.shape)} {kv_cache.dtype}")
        flat = kv_cache.reshape(-1, kv_cache.shape[-1])  # slot = page * page_size + offset
        idx = indices.to(device=q.device, dtype=torch.int64).reshape(batch * n_q, -1)
        if idx.shape[1] == 0 or flat.shape[0] == 0 or batch * n_q == 0:
            return (torch.zeros(batch, n_q, heads, d_v, dtype=torch.bfloat16, device=q.device),
                    torch.full((batch, n_q, heads), float("inf"), dtype=torch.float32, device=q.device))
        _check_indices(idx, flat.shape[0])

        def fetch(i: Tensor) -> Tensor:
            rows = flat.index_select(0, i.reshape(-1))
            return (rows if layout == "bf16" else rows_to_float(rows, layout)).view(*i.shape, D_QK)

        out, lse = _gathered(q.reshape(batch * n_q, heads, D_QK), idx, fetch, sm_scale, d_v)
        return out.view(batch, n_q, heads, d_v).to(torch.bfloat16), lse.view(batch, n_q, heads)
