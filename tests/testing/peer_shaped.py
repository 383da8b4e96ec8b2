"""Backends shaped like real peer kernel libraries, written here in plain PyTorch, each claiming single methods.

* ``flashmla_prefill_like``: FlashMLA's sparse prefill only: bf16 KV, 64 or 128 heads, k a multiple of 128.
* ``flashmla_fp8_decode_like``: FlashMLA's FP8 decode only: ``fp8_656`` KV, 64 or 128 heads, k a multiple of
  64, page size 64, 1 or 2 queries per request.
* ``tilelang_indexer_like``: a ragged-only indexer (``logits_ragged``, no paged path), 32 or 64 heads.

Methods they do not claim raise ``AssertionError``: the kit must never call them.
"""

from __future__ import annotations

import torch

from dsa_runtime.backend import Backend
from dsa_runtime.capabilities import Capabilities, MethodClaim, ValueSet

HEADS = ValueSet.one_of(64, 128)


def _never(name: str):
    def method(self, *args, **kwargs):
        raise AssertionError(f"{name} is not claimed and must never be called")

    return method


def _attend(q: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor, sm_scale: float):
    """q ``[M, H, 576]``, rows ``[M, K, 576]`` fp32, valid ``[M, K]`` -> out ``[M, H, 512]`` bf16, lse ``[M, H]``."""
    rows = torch.where(valid[..., None], rows, 0.0)  # a masked row may hold NaN poison
    scores = torch.einsum("mhd,mkd->mhk", q.float(), rows) * sm_scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    empty = torch.isneginf(lse)
    probs = torch.softmax(scores.masked_fill(empty[..., None], 0.0), dim=-1)
    out = torch.einsum("mhk,mkv->mhv", probs, rows[..., :512]).masked_fill(empty[..., None], 0.0)
    return out.to(torch.bfloat16), torch.where(empty, float("inf"), lse)


class PrefillOnly:
    """Sparse prefill over a flat bf16 buffer; ``-1`` entries masked before the gather is used."""

    def prefill(self, q, kv, indices, sm_scale, d_v=512):
        # What FlashMLA would crash on: the caller must have padded to a claimed shape.
        assert q.shape[1] in (64, 128) and indices.shape[-1] % 128 == 0, (q.shape, indices.shape)
        idx = indices.long()
        valid = idx >= 0
        rows = kv[idx.clamp(min=0)].float()  # [T, K, 576]
        return _attend(q, rows, valid, sm_scale)

    decode = _never("sparse_attn.decode")


class FP8DecodeOnly:
    """Paged decode over the 656-byte FP8 cache (four power-of-two scales per row, k_pe in bf16)."""

    def decode(self, q, kv_cache, indices, sm_scale, *, layout, d_v=512):
        assert layout == "fp8_656", "claims fp8_656 only"
        b, n_q, heads, _ = q.shape
        assert heads in (64, 128) and indices.shape[-1] % 64 == 0, (q.shape, indices.shape)
        flat = kv_cache.reshape(-1, 656)
        idx = indices.reshape(b * n_q, -1).long()
        valid = idx >= 0
        raw = flat[idx.clamp(min=0)]  # [M, K, 656] uint8
        c8 = raw[..., :512].contiguous().view(torch.float8_e4m3fn).float()
        scales = raw[..., 512:528].contiguous().view(torch.float32)  # [M, K, 4]
        c = (c8.unflatten(-1, (4, 128)) * scales[..., None]).flatten(-2)
        k_pe = raw[..., 528:].contiguous().view(torch.bfloat16).float()
        out, lse = _attend(q.reshape(b * n_q, heads, -1), torch.cat([c, k_pe], dim=-1), valid, sm_scale)
        return out.reshape(b, n_q, heads, -1), lse.reshape(b, n_q, heads)

    prefill = _never("sparse_attn.prefill")


class RaggedIndexerOnly:
    """``I[t, s] = k_scale[s] * sum_h w[t, h] * relu(q8[t, h] . k8[s])`` inside ``[ks[t], ke[t])``."""

    def logits_ragged(self, q8, weights, k8, k_scale, ks, ke):
        dots = torch.einsum("thd,sd->tsh", q8.float(), k8.float()).relu()
        logits = (dots * weights[:, None, :]).sum(-1) * k_scale[None, :]
        cols = torch.arange(k8.shape[0], device=k8.device)
        inside = (cols[None, :] >= ks[:, None]) & (cols[None, :] < ke[:, None])
        return torch.where(inside, logits, float("-inf"))

    quantize_q = _never("indexer.quantize_q")
    quantize_k = _never("indexer.quantize_k")
    logits_paged = _never("indexer.logits_paged")


def flashmla_prefill_like() -> Backend:
    return Backend(
        name="flashmla_prefill_like",
        capabilities=Capabilities(
            devices=frozenset({"cpu", "cuda"}),
            methods={
                "sparse_attn.prefill": MethodClaim(
                    kv_layouts=ValueSet.one_of("bf16"), heads=HEADS, k=ValueSet.multiples(128, 128, 16384)
                )
            },
            not_claimed={"sparse_attn.decode": "decode is a separate kernel (flashmla_kv)"},
        ),
        kernels={"sparse_attn": PrefillOnly},
        plugin="tests",
    )


def flashmla_fp8_decode_like() -> Backend:
    return Backend(
        name="flashmla_fp8_decode_like",
        capabilities=Capabilities(
            devices=frozenset({"cpu", "cuda"}),
            methods={
                "sparse_attn.decode": MethodClaim(
                    kv_layouts=ValueSet.one_of("fp8_656"), heads=HEADS, k=ValueSet.multiples(64, 64, 16384),
                    page_sizes=ValueSet.one_of(64), decode_queries=ValueSet.one_of(1, 2),
                )
            },
        ),
        kernels={"sparse_attn": FP8DecodeOnly},
        plugin="tests",
    )


def tilelang_indexer_like() -> Backend:
    return Backend(
        name="tilelang_indexer_like",
        capabilities=Capabilities(
            devices=frozenset({"cpu", "cuda"}),
            methods={"indexer.logits_ragged": MethodClaim(index_heads=ValueSet.one_of(32, 64))},
            not_claimed={"indexer.logits_paged": "no paged path in this library"},
        ),
        kernels={"indexer": RaggedIndexerOnly},
        plugin="tests",
    )


PEERS = {
    "flashmla_prefill_like": (flashmla_prefill_like, ["sparse_attn.prefill"]),
    "flashmla_fp8_decode_like": (flashmla_fp8_decode_like, ["sparse_attn.decode"]),
    "tilelang_indexer_like": (tilelang_indexer_like, ["indexer.logits_ragged"]),
}
