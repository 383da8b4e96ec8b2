"""Deliberately wrong backends: reference kernels with one realistic bug each, for the kit to catch.

Also a few *right-but-different* backends (another tie-break, FP8 activation quantization) that the kit must
let pass, so that its rules are shown to be neither too loose nor too strict.
"""

from __future__ import annotations

import math

import torch

from dsa_runtime.backend import Backend
from dsa_runtime.capabilities import Capabilities
from dsa_runtime.families import D_LATENT, FAMILIES, QUANT_BLOCK
from dsa_runtime.reference.fp8 import block_dequant_weight, quantize_blocks
from dsa_runtime.reference.indexer import ReferenceIndexer
from dsa_runtime.reference.kv_quant import ReferenceKVQuant
from dsa_runtime.reference.moe import ReferenceMoE
from dsa_runtime.reference.plugin import KERNELS
from dsa_runtime.reference.sparse_attn import ReferenceSparseAttn
from dsa_runtime.reference.topk import ReferenceTopK


def make_backend(name: str, overrides: dict[str, type], **caps: object) -> Backend:
    """The reference with some families' kernel classes replaced (and optionally narrower claims)."""
    kernels: dict[str, object] = dict(KERNELS)
    kernels.update(overrides)
    families = caps.pop("families", FAMILIES)
    devices = caps.pop("devices", frozenset({"cpu", "cuda"}))
    return Backend(
        name=name,
        capabilities=Capabilities(families=frozenset(families), devices=devices, **caps),  # type: ignore[arg-type]
        kernels={f: kernels[f] for f in families},
        plugin="tests",
    )


# --- top-k -------------------------------------------------------------------------------------------------
class TopKIgnoresWindows(ReferenceTopK):
    """Selects over the whole row, then reports positions relative to the row start."""

    def topk(self, logits, row_starts, row_ends, k):
        rows, width = logits.shape
        full = super().topk(logits, torch.zeros_like(row_starts), torch.full_like(row_ends, width), k)
        return torch.where(full >= 0, full - row_starts[:, None].to(full), -1).to(torch.int32)


class TopKHighColumnTies(ReferenceTopK):
    """Correct, but breaks ties towards the *higher* column (flip, select, flip back): must pass."""

    def topk(self, logits, row_starts, row_ends, k):
        width = logits.shape[1]
        flipped = super().topk(logits.flip(1), width - row_ends, width - row_starts, k)
        lens = (row_ends - row_starts).to(flipped)[:, None]
        return torch.where(flipped >= 0, lens - 1 - flipped, -1).to(torch.int32)


# --- sparse attention --------------------------------------------------------------------------------------
class SparseAttnDerefsMinusOne(ReferenceSparseAttn):
    """Treats -1 as a real index (Python's last row) instead of skipping it."""

    def prefill(self, q, kv, indices, sm_scale, d_v=512):
        return super().prefill(q, kv, torch.where(indices == -1, kv.shape[0] - 1, indices), sm_scale, d_v)

    def decode(self, q, kv_cache, indices, sm_scale, *, layout, d_v=512):
        last = kv_cache.shape[0] * kv_cache.shape[1] - 1
        return super().decode(q, kv_cache, torch.where(indices == -1, last, indices), sm_scale, layout=layout, d_v=d_v)


class SparseAttnLse2(ReferenceSparseAttn):
    """Returns lse in base 2 (FlashMLA's Sep-2025 convention) instead of natural log."""

    def prefill(self, q, kv, indices, sm_scale, d_v=512):
        out, lse = super().prefill(q, kv, indices, sm_scale, d_v)
        return out, lse / math.log(2)

    def decode(self, q, kv_cache, indices, sm_scale, *, layout, d_v=512):
        out, lse = super().decode(q, kv_cache, indices, sm_scale, layout=layout, d_v=d_v)
        return out, lse / math.log(2)


# --- KV quant ----------------------------------------------------------------------------------------------
class KVQuantScalesAtEnd(ReferenceKVQuant):
    """656-byte rows with the four scales at bytes 640-655 and k_pe at 512-639 (self-consistent, wrong)."""

    def quantize_mla(self, c, k_pe, *, layout):
        rows = super().quantize_mla(c, k_pe, layout=layout)
        if layout != "fp8_656":
            return rows
        return torch.cat([rows[:, :D_LATENT], rows[:, D_LATENT + 16 :], rows[:, D_LATENT : D_LATENT + 16]], dim=1)

    def dequantize_mla(self, rows, *, layout):
        if layout == "fp8_656":
            rows = torch.cat([rows[:, :D_LATENT], rows[:, -16:], rows[:, D_LATENT:-16]], dim=1)
        return super().dequantize_mla(rows, layout=layout)


class KVQuantWritesMinusOne(ReferenceKVQuant):
    """store_mla writes slot -1 too (lands on the last slot of the cache through negative indexing)."""

    def store_mla(self, kv_cache, slots, c, k_pe, *, layout):
        rows = self.quantize_mla(c, k_pe, layout=layout)
        kv_cache.view(-1, kv_cache.shape[-1])[slots.long()] = rows


class KVQuantRaises(ReferenceKVQuant):
    def gather_index_k(self, index_cache, slots):
        raise RuntimeError("gather kernel not compiled for this arch")


# --- MoE ---------------------------------------------------------------------------------------------------
class MoEBiasedWeights(ReferenceMoE):
    """Chooses correctly but takes the weights from the *biased* scores p + bias."""

    def route(self, router_logits, correction_bias, *, top_k, n_group, topk_group, routed_scaling_factor, renormalize=True):
        _, ids = super().route(
            router_logits, correction_bias, top_k=top_k, n_group=n_group, topk_group=topk_group,
            routed_scaling_factor=1.0, renormalize=False,
        )
        w = torch.gather(torch.sigmoid(router_logits.float()) + correction_bias.float(), 1, ids.long())
        if renormalize:
            w = w / w.sum(dim=-1, keepdim=True)
        return w * routed_scaling_factor, ids


class MoEMinusOneIsLastExpert(ReferenceMoE):
    """Treats expert id -1 as the last expert instead of skipping it."""

    def experts(self, x, topk_weights, topk_ids, experts, shared=None, *, out_dtype=None):
        ids = torch.where(topk_ids < 0, experts.w13.shape[0] - 1, topk_ids)
        return super().experts(x, topk_weights, ids, experts, shared, out_dtype=out_dtype)


class MoERoundsPartialSums(ReferenceMoE):
    """Returns bf16 whatever ``out_dtype`` asks: a TP rank's partial sum rounded before the all-reduce."""

    def experts(self, x, topk_weights, topk_ids, experts, shared=None, *, out_dtype=None):
        return super().experts(x, topk_weights, topk_ids, experts, shared)


def _fake_quant_act(x: torch.Tensor) -> torch.Tensor:
    """Per-(row, 128 columns) ue8m0 FP8 quantize-dequantize, as FP8 GEMM kernels do to activations."""
    cols = x.shape[-1]
    pad = (-cols) % QUANT_BLOCK
    xp = torch.nn.functional.pad(x.float(), (0, pad))
    q, s = quantize_blocks(xp, "ue8m0")
    return (q.float().reshape(*xp.shape[:-1], -1, QUANT_BLOCK) * s.unsqueeze(-1)).reshape(xp.shape)[..., :cols]


class MoEFP8Activations(ReferenceMoE):
    """Right answer the GPU way: activations (x and the SwiGLU output) FP8-quantized per 128: must pass."""

    def experts(self, x, topk_weights, topk_ids, experts, shared=None, *, out_dtype=None):
        if not experts.is_fp8:
            return super().experts(x, topk_weights, topk_ids, experts, shared, out_dtype=out_dtype)

        def weights(ew, e):
            if ew.is_fp8:
                return block_dequant_weight(ew.w13[e], ew.w13_scale[e]), block_dequant_weight(ew.w2[e], ew.w2_scale[e])
            return ew.w13[e].float(), ew.w2[e].float()

        def ffn(xr, w13, w2):
            inter = w13.shape[0] // 2
            h = _fake_quant_act(xr) @ w13.T
            return _fake_quant_act(torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]) @ w2.T

        xf, ids = x.float(), topk_ids.long()
        out = torch.zeros_like(xf)
        for e in torch.unique(ids[ids >= 0]).tolist():
            tok, slot = torch.nonzero(ids == e, as_tuple=True)
            out.index_add_(0, tok, ffn(xf[tok], *weights(experts, e)) * topk_weights[tok, slot, None].float())
        if shared is not None:
            out += ffn(xf, *weights(shared, 0))
        return out if out_dtype == torch.float32 else out.to(torch.bfloat16)


# --- indexer -----------------------------------------------------------------------------------------------
class IndexerNoHadamard(ReferenceIndexer):
    """Quantizes q and k without the Walsh-Hadamard rotation."""

    def quantize_q(self, q, head_weights, *, scale_fmt="ue8m0"):
        q8, q_scale = quantize_blocks(q.float(), scale_fmt)
        heads = q.shape[1]
        return q8, head_weights.float() * heads**-0.5 * q_scale.squeeze(-1) * 128**-0.5

    def quantize_k(self, k, *, scale_fmt="ue8m0"):
        k8, s = quantize_blocks(k.float(), scale_fmt)
        return k8, s.squeeze(-1)


class IndexerIgnoresMTPCausal(ReferenceIndexer):
    """Paged decode where every MTP query sees the whole context (the 2nd query's limit is ignored)."""

    def logits_paged(self, q8, weights, index_cache, context_lens, block_table, max_context_len):
        batch, n_q = q8.shape[:2]
        rows = [
            super(IndexerIgnoresMTPCausal, self).logits_paged(
                q8[:, j : j + 1], weights.view(batch, n_q, -1)[:, j], index_cache, context_lens, block_table,
                max_context_len,
            )
            for j in range(n_q)
        ]
        return torch.stack(rows, dim=1).reshape(batch * n_q, -1)


# --- the kit's former gaps and the peers' bugs (kept in their own module) ----------------------------------
from tests.testing.wrong_backends_edges import (  # noqa: E402, F401
    IndexerBf16Rotation,
    IndexerScaleTwiceTooCoarse,
    IndexerTruncates,
    IndexerZeroPastLastEnd,
    KVQuantFloatScales,
    KVQuantScaleTwiceTooCoarse,
    KVQuantTruncates,
    MoEBf16Bias,
    MoENaNOnUnderflow,
    MoEScaleOnlyWhenRenorm,
    SparseAttnOffByOne,
    SparseAttnPrefillMinusOneIsRowZero,
    SparseAttnTop1FastPath,
    TopKNaNFirst,
    TopKPadsWithZero,
)

