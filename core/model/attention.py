"""Attention over the paged MLA cache for one layer: absorbed (MQA) sparse/dense paths and dense MHA.

Every path reads the keys back from the cache *after* this step's rows were written, so prefill, chunked
prefill and decode see exactly the same stored values (bf16 rows, or FP8 rows whose ue8m0 scales make the
bf16 dequantisation exact) and agree with each other.

* decode (one new token): ``kernels.sparse_attn.decode`` over the paged cache, indices = physical slots:
  the indexer's top-k through ``logits_paged`` + ``topk_transform`` when the context exceeds ``index_topk``,
  else every visible slot (dense, exact). The V3 family always takes every visible slot.
* prefill chunk, absorbed: the sequence's rows ``0 .. end-1`` gathered and dequantised to a flat bf16 buffer
  (``kernels.kv_quant.dequantize_mla``), ``kernels.sparse_attn.prefill`` with indices into it: top-k of
  ``logits_ragged`` over the sequence's cached index keys (``gather_index_k``), or every causal position.
* prefill chunk, dense MHA (DSA: ``end <= index_topk``; V3: ``end <= mha_max_keys``): per-head
  ``k_nope = W_UK c`` and ``v = W_UV c`` from the cached latents, causal softmax in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dsa_runtime.model.batch import SeqMeta, StepMeta
from dsa_runtime.model.index_select import default_budget, select_topk_ragged

MHA_ROW_CHUNK = 128
DENSE_WIDTH_MULTIPLE = 64  # dense (V3) index sets are padded to this, the granularity GPU kernels claim


@dataclass
class AttnContext:
    """What the attention of every layer shares in one step."""

    kernels: object
    step: StepMeta
    kv_layout: str
    sm_scale: float
    index_topk: int | None  # None: dense V3 family
    mha_max_keys: int  # dense prefill with at most this many keys uses MHA (0: never)
    index_scale_fmt: str
    index_budget_bytes: int | None = None  # indexer logits + top-k workspace per row chunk (None: default)

    def is_dense(self, seq: SeqMeta) -> bool:
        return self.index_topk is None or seq.end_pos <= self.index_topk

    def uses_mha(self, seq: SeqMeta) -> bool:
        return not seq.is_decode and self.is_dense(seq) and seq.end_pos <= self.mha_max_keys

    def needs_index_queries(self) -> bool:
        return any(not self.is_dense(s) for s in self.step.seqs)

    def index_width(self, longest: int) -> int:
        """Width K of the index tensors: ``index_topk`` for DSA (what the kernels were resolved for, dense
        rows padded with -1); for the V3 family the longest visible context rounded up to 64."""
        if self.index_topk is not None:
            return self.index_topk
        return -(-longest // DENSE_WIDTH_MULTIPLE) * DENSE_WIDTH_MULTIPLE


def _pad_rows(rows: list[Tensor], width: int, device) -> Tensor:
    out = torch.full((len(rows), width), -1, dtype=torch.int32, device=device)
    for i, r in enumerate(rows):
        out[i, : r.numel()] = r.to(torch.int32)
    return out


def decode_attention(ctx: AttnContext, seqs: list[SeqMeta], q: Tensor, kv_cache: Tensor,
                     index_cache: Tensor | None, iq) -> Tensor:
    """q ``[B, H, 576]`` (one row per decode seq) -> latent outputs ``[B, H, 512]``."""
    kernels, step, device = ctx.kernels, ctx.step, q.device
    ps = step.page_size
    rows: list[Tensor | None] = [None] * len(seqs)
    sparse = [i for i, s in enumerate(seqs) if not ctx.is_dense(s)]
    for i, s in enumerate(seqs):
        if i not in sparse:
            rows[i] = step.slots_of(s)
    if sparse:
        ctx_lens = torch.tensor([seqs[i].end_pos for i in sparse], dtype=torch.int32, device=device)
        max_pages = max(seqs[i].page_table.numel() for i in sparse)
        table = torch.zeros(len(sparse), max_pages, dtype=torch.int32, device=device)
        for j, i in enumerate(sparse):
            table[j, : seqs[i].page_table.numel()] = seqs[i].page_table.to(torch.int32)
        tok = torch.tensor([seqs[i].t0 for i in sparse], device=device)
        q8 = iq.q8[tok].unsqueeze(1)  # [Bs, 1, n, 128]
        logits = kernels.indexer.logits_paged(q8, iq.weights[tok], index_cache, ctx_lens, table,
                                              int(ctx_lens.max()))
        picked = kernels.topk.topk_transform(
            logits, torch.zeros_like(ctx_lens), ctx_lens, ctx.index_topk, table,
            torch.arange(len(sparse), dtype=torch.int32, device=device), ps,
        )
        for j, i in enumerate(sparse):
            rows[i] = picked[j]
    width = ctx.index_width(max(r.numel() for r in rows))  # type: ignore[union-attr]
    indices = _pad_rows(rows, width, device)  # type: ignore[arg-type]
    out, _lse = kernels.sparse_attn.decode(
        q.unsqueeze(1), kv_cache, indices.unsqueeze(1), ctx.sm_scale, layout=ctx.kv_layout
    )
    return out[:, 0]


def gathered_rows(ctx: AttnContext, seq: SeqMeta, kv_cache: Tensor) -> Tensor:
    """The sequence's cached rows ``0 .. end-1`` as ``[end, 576]`` bf16 (dequantised when FP8)."""
    flat = kv_cache.reshape(-1, kv_cache.shape[-1])
    return ctx.kernels.kv_quant.dequantize_mla(flat[ctx.step.slots_of(seq)], layout=ctx.kv_layout)


def prefill_absorbed(ctx: AttnContext, seq: SeqMeta, q: Tensor, kv_cache: Tensor,
                     index_cache: Tensor | None, iq) -> Tensor:
    """q ``[len, H, 576]`` of one prefill chunk -> latent outputs ``[len, H, 512]``."""
    kernels, device = ctx.kernels, q.device
    kv = gathered_rows(ctx, seq, kv_cache)
    pos = ctx.step.positions[seq.t0:seq.t1]
    ends = (pos + 1).to(torch.int32)
    if ctx.is_dense(seq):
        cols = torch.arange(ctx.index_width(seq.end_pos), device=device)
        indices = torch.where(cols[None, :] < ends[:, None], cols[None, :], -1).to(torch.int32)
    else:
        k8, k_scale = kernels.kv_quant.gather_index_k(index_cache, ctx.step.slots_of(seq))
        starts = torch.zeros_like(ends)
        # Logits and top-k in row chunks within the budget (never a full [len, end] matrix of a long chunk).
        # Positions relative to the row start (0) are rows of the gathered buffer: no slot transform needed.
        indices = select_topk_ragged(kernels, iq.q8[seq.t0:seq.t1], iq.weights[seq.t0:seq.t1], k8, k_scale,
                                     starts, ends, ctx.index_topk,
                                     budget_bytes=ctx.index_budget_bytes or default_budget(device))
    out, _lse = kernels.sparse_attn.prefill(q, kv, indices, ctx.sm_scale)
    return out


def prefill_mha(ctx: AttnContext, seq: SeqMeta, q_nope: Tensor, q_pe: Tensor, kv_cache: Tensor,
                w_uk: Tensor, w_uv: Tensor) -> Tensor:
    """Dense causal MHA for one chunk. q_nope ``[len, H, nope]``, q_pe ``[len, H, rope]`` -> ``[len, H, v]``.

    w_uk ``[H, nope, 512]``, w_uv ``[H, v, 512]``; keys/values rebuilt per head from the cached latents.
    """
    # fp32 throughout: bf16 scores (|s| ~ 10, ulp 0.06) would add far more noise than the absorbed path has.
    kv = gathered_rows(ctx, seq, kv_cache).float()
    d_lat = w_uk.shape[-1]
    c, k_pe = kv[:, :d_lat], kv[:, d_lat:]
    k_nope = torch.einsum("sc,hnc->hsn", c, w_uk.float())
    v = torch.einsum("sc,hvc->hsv", c, w_uv.float())
    q_nope, q_pe = q_nope.float(), q_pe.float()
    pos = ctx.step.positions[seq.t0:seq.t1]
    keys = torch.arange(seq.end_pos, device=q_nope.device)
    out = torch.empty(q_nope.shape[0], w_uv.shape[0], w_uv.shape[1], dtype=w_uv.dtype, device=q_nope.device)
    for r0 in range(0, q_nope.shape[0], MHA_ROW_CHUNK):
        r1 = min(r0 + MHA_ROW_CHUNK, q_nope.shape[0])
        scores = torch.einsum("thn,hsn->hts", q_nope[r0:r1], k_nope)
        scores += torch.einsum("thr,sr->hts", q_pe[r0:r1], k_pe)
        scores *= ctx.sm_scale
        scores.masked_fill_(keys[None, None, :] > pos[None, r0:r1, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[r0:r1] = torch.einsum("hts,hsv->thv", probs, v).to(out.dtype)
    return out
