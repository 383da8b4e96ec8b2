"""Deliberately wrong kernels for the kit's former gaps and the peers' bugs: each passed the kit before the
edge cases and the stricter FP8 rules were added, and each must fail now. Re-exported by
``tests/testing/wrong_backends.py``.
"""

from __future__ import annotations

import torch

from dsa_runtime.families import D_LATENT, INDEX_HEAD_DIM, QUANT_BLOCK
from dsa_runtime.reference.fp8 import round_up_pow2
from dsa_runtime.reference.hadamard import hadamard_rotate
from dsa_runtime.reference.indexer import ReferenceIndexer
from dsa_runtime.reference.kv_quant import ReferenceKVQuant
from dsa_runtime.reference.moe import ReferenceMoE
from dsa_runtime.reference.sparse_attn import ReferenceSparseAttn
from dsa_runtime.reference.topk import ReferenceTopK

E4M3 = torch.float8_e4m3fn


# --- FP8 quantization with a chosen (wrong) scale rule or rounding -------------------------------------------
def _scales(amax: torch.Tensor, rule: str) -> torch.Tensor:
    s = amax.float().clamp_min(1e-4) / 448.0
    if rule == "float":
        return s
    if rule == "frexp":  # 2**exponent of frexp: equals ceil for all but exact powers of two, where it is 2s
        _, e = torch.frexp(s)
        return torch.ldexp(torch.ones_like(s), e)
    if rule == "double":
        return 2 * round_up_pow2(s)
    return round_up_pow2(s)


def _quant(x: torch.Tensor, rule: str, rounding: str = "nearest") -> tuple[torch.Tensor, torch.Tensor]:
    """Block quantization ``[..., n]`` -> e4m3 and scales ``[..., n // 128]`` under ``rule``/``rounding``."""
    tiles = x.float().reshape(*x.shape[:-1], -1, QUANT_BLOCK)
    s = _scales(tiles.abs().amax(-1), rule)
    v = (tiles / s.unsqueeze(-1)).clamp(-448, 448)
    if rounding == "trunc":  # toward zero: up to a whole ulp off, where round-to-nearest stays within half
        a = v.abs()
        _, e = torch.frexp(a)
        ulp = torch.where(a >= 2.0**-6, torch.ldexp(torch.ones_like(a), e - 4), torch.full_like(a, 2.0**-9))
        v = torch.sign(v) * torch.floor(a / ulp) * ulp
    return v.to(E4M3).reshape(x.shape), s


class _KVQuantRule(ReferenceKVQuant):
    rule, rounding = "ue8m0", "nearest"

    def quantize_mla(self, c, k_pe, *, layout):
        rows = super().quantize_mla(c, k_pe, layout=layout)
        if layout != "fp8_656":
            return rows
        c8, s = _quant(c, self.rule, self.rounding)
        rows[:, :D_LATENT] = c8.view(torch.uint8)
        rows[:, D_LATENT : D_LATENT + 16] = s.contiguous().view(torch.uint8)
        return rows  # store_mla packs through quantize_mla, so the cache gets the same rows


class KVQuantFloatScales(_KVQuantRule):
    """Writes amax / 448 scales into the fp8_656 cache (the decode reads whatever scale is stored)."""

    rule = "float"


class KVQuantScaleTwiceTooCoarse(_KVQuantRule):
    """ue8m0 scale from frexp's exponent: twice too coarse for blocks whose amax is exactly 448 * 2**k."""

    rule = "frexp"


class KVQuantTruncates(_KVQuantRule):
    """Right scale, but rounds toward zero: errors up to one e4m3 ulp."""

    rounding = "trunc"


class _IndexerRule(ReferenceIndexer):
    rule, rounding = "ue8m0", "nearest"

    def _rule(self, scale_fmt):
        return self.rule if scale_fmt == "ue8m0" or self.rounding != "nearest" else scale_fmt

    def quantize_q(self, q, head_weights, *, scale_fmt="ue8m0"):
        q8, q_scale = _quant(hadamard_rotate(q), self._rule(scale_fmt), self.rounding)
        heads = q.shape[1]
        return q8, head_weights.float() * heads**-0.5 * q_scale.squeeze(-1) * INDEX_HEAD_DIM**-0.5

    def quantize_k(self, k, *, scale_fmt="ue8m0"):
        k8, s = _quant(hadamard_rotate(k), self._rule(scale_fmt), self.rounding)
        return k8, s.squeeze(-1)


class IndexerScaleTwiceTooCoarse(_IndexerRule):
    """Asked for ue8m0 scales, returns the next power of two up (self-consistent, so the values stay close)."""

    rule = "double"


class IndexerTruncates(_IndexerRule):
    """Right scales, rounds toward zero."""

    rounding = "trunc"


class IndexerZeroPastLastEnd(ReferenceIndexer):
    """Ragged logits computed only up to ``max(ends)``; the rest of each row is left as allocated (zeros)."""

    def logits_ragged(self, q8, weights, k8, k_scale, ks, ke):
        m = int(ke.max()) if ke.numel() else 0
        out = torch.zeros(q8.shape[0], k8.shape[0], dtype=torch.float32, device=q8.device)
        out[:, :m] = super().logits_ragged(q8, weights, k8[:m], k_scale[:m], ks, ke)
        return out


# --- top-k ---------------------------------------------------------------------------------------------------
class TopKPadsWithZero(ReferenceTopK):
    """Pads rows shorter than k with position 0 instead of -1 (a peer's bug: the padding looks valid)."""

    def topk(self, logits, row_starts, row_ends, k):
        out = super().topk(logits, row_starts, row_ends, k)
        return torch.where(out < 0, 0, out).to(torch.int32)


class TopKNaNFirst(ReferenceTopK):
    """Ranks NaN above everything (``torch.topk``'s order) instead of as -inf."""

    def topk(self, logits, row_starts, row_ends, k):
        return super().topk(torch.where(logits.isnan(), float("inf"), logits), row_starts, row_ends, k)


# --- sparse attention ----------------------------------------------------------------------------------------
class SparseAttnPrefillMinusOneIsRowZero(ReferenceSparseAttn):
    """Prefill reads index -1 as row 0 (a peer's bug: a clamp where a mask belongs)."""

    def prefill(self, q, kv, indices, sm_scale, d_v=512):
        return super().prefill(q, kv, indices.clamp(min=0), sm_scale, d_v)


class SparseAttnOffByOne(ReferenceSparseAttn):
    """Treats index S - 1 (prefill) / the last cache slot (decode) as invalid: ``idx < S - 1``."""

    def prefill(self, q, kv, indices, sm_scale, d_v=512):
        return super().prefill(q, kv, torch.where(indices >= kv.shape[0] - 1, -1, indices), sm_scale, d_v)

    def decode(self, q, kv_cache, indices, sm_scale, *, layout, d_v=512):
        last = kv_cache.shape[0] * kv_cache.shape[1] - 1
        return super().decode(q, kv_cache, torch.where(indices >= last, -1, indices), sm_scale, layout=layout, d_v=d_v)


class SparseAttnTop1FastPath(ReferenceSparseAttn):
    """A special path for k = 1 that gathers its one row without checking for -1 (Python's last row)."""

    def prefill(self, q, kv, indices, sm_scale, d_v=512):
        if indices.shape[-1] != 1:
            return super().prefill(q, kv, indices, sm_scale, d_v)
        row = kv[indices[:, 0].long()].float()  # [T, 576]; -1 reads the last row
        score = torch.einsum("thd,td->th", q.float(), row) * sm_scale
        return row[:, None, :d_v].expand(-1, q.shape[1], -1).to(torch.bfloat16), score

    def decode(self, q, kv_cache, indices, sm_scale, *, layout, d_v=512):
        if indices.shape[-1] != 1:
            return super().decode(q, kv_cache, indices, sm_scale, layout=layout, d_v=d_v)
        last = kv_cache.shape[0] * kv_cache.shape[1] - 1
        return super().decode(q, kv_cache, torch.where(indices < 0, last, indices), sm_scale, layout=layout, d_v=d_v)


# --- MoE routing ---------------------------------------------------------------------------------------------
class MoENaNOnUnderflow(ReferenceMoE):
    """Renormalizes by the sum without a guard: 0 / 0 = NaN when every sigmoid underflowed."""

    def route(self, router_logits, correction_bias, *, top_k, n_group, topk_group, routed_scaling_factor, renormalize=True):
        w, ids = super().route(router_logits, correction_bias, top_k=top_k, n_group=n_group, topk_group=topk_group,
                               routed_scaling_factor=1.0, renormalize=False)
        if renormalize:
            w = w / w.sum(dim=-1, keepdim=True)
        return w * routed_scaling_factor, ids


class MoEScaleOnlyWhenRenorm(ReferenceMoE):
    """Applies routed_scaling_factor only on the renormalized path."""

    def route(self, router_logits, correction_bias, *, top_k, n_group, topk_group, routed_scaling_factor, renormalize=True):
        return super().route(router_logits, correction_bias, top_k=top_k, n_group=n_group, topk_group=topk_group,
                             routed_scaling_factor=routed_scaling_factor if renormalize else 1.0,
                             renormalize=renormalize)


class MoEBf16Bias(ReferenceMoE):
    """Adds the correction bias in bf16 precision (a bias tensor kept in the model's dtype)."""

    def route(self, router_logits, correction_bias, *, top_k, n_group, topk_group, routed_scaling_factor, renormalize=True):
        return super().route(router_logits, correction_bias.to(torch.bfloat16).float(), top_k=top_k, n_group=n_group,
                             topk_group=topk_group, routed_scaling_factor=routed_scaling_factor,
                             renormalize=renormalize)



class IndexerBf16Rotation(ReferenceIndexer):
    """Right answer the GPU way: the rotated q/k rounded to bf16 before the FP8 cast (as kernels that rotate in
    bf16 do), and the block amax taken from those bf16 values: must pass."""

    def quantize_q(self, q, head_weights, *, scale_fmt="ue8m0"):
        q8, q_scale = _quant(hadamard_rotate(q.float()).to(torch.bfloat16), scale_fmt)
        heads = q.shape[1]
        return q8, head_weights.float() * heads**-0.5 * q_scale.squeeze(-1) * INDEX_HEAD_DIM**-0.5

    def quantize_k(self, k, *, scale_fmt="ue8m0"):
        k8, s = _quant(hadamard_rotate(k.float()).to(torch.bfloat16), scale_fmt)
        return k8, s.squeeze(-1)
