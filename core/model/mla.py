"""Multi-head latent attention of one layer with its optional lightning indexer.

Projections run batched over every token of the step; the new latent rows ``[c | k_pe]`` (and index keys)
are written to the cache first, then attention reads them back per sequence (see ``attention.py``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.model.attention import (
    AttnContext,
    decode_attention,
    mha_groups,
    prefill_absorbed,
    prefill_mha,
)
from dsa_runtime.model.batch import SeqMeta
from dsa_runtime.model.config import ModelConfig
from dsa_runtime.model.indexer import Indexer
from dsa_runtime.model.ops import FEW_ROWS, fp32_copy, linear, rms_norm
from dsa_runtime.model.rope import apply_interleaved
from dsa_runtime.model.weights import WeightSource


def _absorbed_rows(ctx: AttnContext, seqs: list[SeqMeta], device) -> Tensor:
    """Token rows ``[n]`` of the step's decode rows and of the absorbed prefill chunks ``seqs`` (memoised)."""
    key = ("rows", tuple(s.index for s in seqs))
    rows = ctx.memo.get(key)
    if rows is None:
        parts = [torch.arange(s.t0, s.t1, device=device) for s in seqs]
        if ctx.decode is not None:
            parts.insert(0, ctx.decode.index)
        rows = ctx.memo[key] = torch.cat(parts)
    return rows  # type: ignore[return-value]


class MLA:
    """Weights (model dtype unless noted): wq_a / q_norm / wq_b (or wq without q-LoRA), wkv_a, kv_norm,
    w_uk ``[H, nope, 512]`` and w_uv ``[H, v, 512]`` split from kv_b_proj, wo ``[D, H * v]``."""

    def __init__(self, ws: WeightSource, prefix: str, config: ModelConfig, tp=None):
        self.cfg, self.tp = config, tp
        # Local heads: all of them on one process, H / attn_size under TP (sliced by dsa_runtime.distributed).
        attn_size = tp.info.attn_size if tp is not None else 1
        self.heads, self.nope, self.rope = config.num_attention_heads // attn_size, config.qk_nope_head_dim, config.qk_rope_head_dim
        self.v_dim, self.lora = config.v_head_dim, config.kv_lora_rank
        eps = config.rms_norm_eps
        self.eps = eps
        if config.q_lora_rank is not None:
            self.wq_a = ws.linear(f"{prefix}.q_a_proj")
            self.q_norm = ws.norm(f"{prefix}.q_a_layernorm.weight")
            self.wq_b = ws.linear(f"{prefix}.q_b_proj")
        else:
            self.wq = ws.linear(f"{prefix}.q_proj")
        self.wkv_a = ws.linear(f"{prefix}.kv_a_proj_with_mqa")
        self.kv_norm = ws.norm(f"{prefix}.kv_a_layernorm.weight")
        kv_b = ws.linear(f"{prefix}.kv_b_proj").view(self.heads, self.nope + self.v_dim, self.lora)
        self.w_uk = kv_b[:, : self.nope].contiguous()
        self.w_uv = kv_b[:, self.nope:].contiguous()
        self.wo = ws.linear(f"{prefix}.o_proj")
        self._kv_t: Tensor | None = None  # kv_b_proj for the MHA prefill, built on first use (see _w_kv)
        self.indexer: Indexer | None = None
        # IndexCache: this layer skips its indexer queries and top-k and reuses the last Full layer's indices
        # (its index keys are still written: cheap, and any layer's cache stays complete).
        self.reuse_topk = False
        if config.is_dsa:
            if config.q_lora_rank is None:
                raise ValueError("a DSA model needs q_lora_rank (the indexer reads the q_norm output)")
            self.indexer = Indexer(ws, f"{prefix}.indexer", config.index_n_heads, config.index_head_dim,
                                   config.qk_rope_head_dim, eps)

    def __call__(self, x: Tensor, turn: Tensor, ctx: AttnContext, kv_cache: Tensor,
                 index_cache: Tensor | None) -> Tensor:
        """x ``[T, D]`` (normed hidden, model dtype) -> attention output ``[T, D]``."""
        t = x.shape[0]
        if self.cfg.q_lora_rank is not None:
            qr = rms_norm(linear(x, self.wq_a), self.q_norm, self.eps)
            q = linear(qr, self.wq_b).view(t, self.heads, self.nope + self.rope)
        else:
            qr = None
            q = linear(x, self.wq).view(t, self.heads, self.nope + self.rope)
        q_nope = q[..., : self.nope]
        q_pe = apply_interleaved(q[..., self.nope:], turn)  # MLA rope: LAST dims, interleaved pairs
        kv = linear(x, self.wkv_a)
        c = rms_norm(kv[:, : self.lora], self.kv_norm, self.eps)  # only the latent is normalised
        k_pe = apply_interleaved(kv[:, self.lora:], turn)
        locs = ctx.step.locs
        # fp8_656 rows always carry ue8m0 scales, so the bf16 rows prefill reads back equal what decode reads.
        ctx.kernels.kv_quant.store_mla(kv_cache, locs, c, k_pe, layout=ctx.kv_layout)
        iq = None
        ctx.reuse_topk = self.reuse_topk
        if self.indexer is not None:
            self.indexer.write_keys(x, turn, ctx.kernels, index_cache, locs, ctx.index_scale_fmt)
            if ctx.needs_index_queries() and not self.reuse_topk:
                iq = self.indexer.queries(x, qr, turn, ctx.kernels, ctx.index_scale_fmt)
        seqs = ctx.step.seqs
        groups = mha_groups(ctx)
        if not groups:  # every row goes through the absorbed kernels: one up-projection for all of them
            out = self._up_v(self._absorbed(ctx, seqs, q_nope, q_pe, kv_cache, index_cache, iq))
        else:
            out = torch.empty(t, self.heads, self.v_dim, dtype=x.dtype, device=x.device)
            absorbed = [s for s in seqs if not ctx.uses_mha(s)]
            if absorbed or ctx.decode is not None:
                rows = _absorbed_rows(ctx, absorbed, x.device)
                lat = self._absorbed(ctx, absorbed, q_nope, q_pe, kv_cache, index_cache, iq)
                out[rows] = self._up_v(lat.index_select(0, rows))
            for group in groups:
                rows, y = prefill_mha(ctx, group, q_nope, q_pe, kv_cache, self._w_kv(), self.v_dim, index_cache, iq)
                out[rows] = y.to(out.dtype)
        if self.tp is None or self.tp.info.attn_size == 1:
            return linear(out.reshape(t, self.heads * self.v_dim), self.wo)
        # Row-parallel o_proj under TP: each rank holds its heads' columns; the partial sums add up. They
        # stay fp32 through the all-reduce (reduce_dtype fp32) and are rounded once, as tp 1 rounds its sum.
        y = linear(out.reshape(t, self.heads * self.v_dim), self.wo, self.tp.partial_dtype(x.dtype))
        return self.tp.all_reduce_attn(y).to(x.dtype)

    def _absorbed(self, ctx: AttnContext, seqs: list[SeqMeta], q_nope: Tensor, q_pe: Tensor, kv_cache: Tensor,
                  index_cache: Tensor | None, iq) -> Tensor:
        """Latent outputs ``[T, H, 512]`` of the absorbed (MQA) kernels for the step's decode rows and the prefill
        chunks ``seqs``; rows of other chunks are zero."""
        # Absorb W_UK into the query: score = [q_nope W_UK | q_pe] . [c | k_pe] (576-d MQA).
        q_abs = torch.cat([self._per_head(q_nope, self.w_uk), q_pe], dim=-1)
        d = ctx.decode
        if d is not None and d.index is None:  # every row is a decode row: the kernel's rows are the step's
            return decode_attention(ctx, q_abs, kv_cache, index_cache, iq)
        lat = torch.zeros(q_abs.shape[0], self.heads, self.lora, dtype=torch.bfloat16, device=q_abs.device)
        if d is not None:
            lat[d.index] = decode_attention(ctx, q_abs.index_select(0, d.index), kv_cache, index_cache,
                                            iq).to(lat.dtype)
        if seqs:
            for rows, out in prefill_absorbed(ctx, seqs, q_abs, kv_cache, index_cache, iq):
                lat[rows] = out.to(lat.dtype)
        return lat

    def _w_kv(self) -> Tensor:
        """kv_b_proj as ``[512, H * (nope + v)]`` (model dtype) for the MHA prefill, built on first use."""
        w = self._kv_t
        if w is None:
            w = self._kv_t = torch.cat([self.w_uk, self.w_uv], dim=1).reshape(-1, self.lora).T.contiguous()
        return w

    def _up_v(self, lat: Tensor) -> Tensor:
        """Latent attention output ``[n, H, 512]`` (bf16 from the kernels) -> per-head values ``[n, H, v]``."""
        return self._per_head(lat.to(self.w_uv.dtype), self.w_uv, transpose=True)

    @staticmethod
    def _per_head(x: Tensor, w: Tensor, transpose: bool = False) -> Tensor:
        """Per-head product: x ``[T, H, a]`` times w ``[H, a, b]`` (``transpose``: w ``[H, b, a]``, used as its
        transpose) -> ``[T, H, b]`` in x's dtype, one batched GEMM over the heads; few bf16 rows in fp32 (see
        ``ops.linear``)."""
        if x.shape[0] <= FEW_ROWS and x.dtype == torch.bfloat16:
            wf = fp32_copy(w)
            if wf is not None:
                return MLA._per_head(x.float(), wf, transpose).to(x.dtype)
        return torch.bmm(x.transpose(0, 1), w.transpose(1, 2) if transpose else w).transpose(0, 1)
