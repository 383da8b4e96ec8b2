"""A stand-in ``flash_mla`` module for CPU tests of the FlashMLA adapters (plain PyTorch, FlashMLA's checks).

It enforces what FlashMLA 9241ae3 checks or crashes on (h_q 64/128, prefill topk % 128, decode page block 64,
h_kv 1 axes, int32 indices, the 656-byte row) and returns FlashMLA's layouts: prefill ``(out, max_logits,
lse [s_q, h_q])``, decode ``(out [b, s_q, h_q, 512], lse [b, h_q, s_q])`` as a transposed view, like the
library. ``make(generation="old")`` builds the pre-PR-#150 API (tensor metadata, base-2 prefill lse, ``-inf``
for an empty query). Every call is recorded in ``module.calls``.
"""

from __future__ import annotations

import math
import types

import torch

from dsa_runtime.reference.sparse_attn import ReferenceSparseAttn

REF = ReferenceSparseAttn()


class _SchedMeta:
    """FlashMLASchedMeta's role: filled lazily by the first decode call, then reused for the same shapes."""

    def __init__(self) -> None:
        self.config: tuple | None = None


def make(generation: str = "new") -> types.ModuleType:
    mod = types.ModuleType("flash_mla")
    mod.calls = []

    def _prefill(q, kv, indices, sm_scale, d_v=512):
        assert q.dtype == kv.dtype == torch.bfloat16 and indices.dtype == torch.int32
        assert q.dim() == 3 and kv.dim() == 3 and kv.shape[1] == 1 and indices.dim() == 3 and indices.shape[1] == 1
        assert q.shape[1] in (64, 128), f"Unsupported h_q: {q.shape[1]}"
        assert indices.shape[-1] % 128 == 0, "params.topk % (2*B_TOPK) == 0"  # the real one then segfaults
        assert d_v == 512 and q.shape[-1] == kv.shape[-1] == 576
        mod.calls.append(("prefill", tuple(q.shape), tuple(kv.shape), tuple(indices.shape)))
        out, lse = REF.prefill(q, kv[:, 0], indices[:, 0], sm_scale, d_v)
        if generation == "old":
            lse = torch.where(torch.isposinf(lse), -math.inf, lse / math.log(2.0))
        return out, torch.zeros_like(lse), lse

    def _decode(q, k_cache, indices, sm_scale, d_v):
        assert q.dtype == torch.bfloat16 and k_cache.dtype == torch.uint8 and indices.dtype == torch.int32
        assert k_cache.dim() == 4 and k_cache.shape[1] == 64 and k_cache.shape[2] == 1 and k_cache.shape[3] == 656
        assert k_cache.stride(1) == 656, "The whole block must be contiguous"
        b, s_q, h_q, d_qk = q.shape
        assert h_q in (64, 128), f"Unsupported h_q: {h_q}"
        assert tuple(indices.shape[:2]) == (b, s_q) and indices.shape[-1] % 64 == 0 and d_qk == 576 and d_v == 512
        mod.calls.append(("decode", tuple(q.shape), tuple(k_cache.shape), tuple(indices.shape)))
        out, lse = REF.decode(q, k_cache[:, :, 0], indices, sm_scale, layout="fp8_656", d_v=d_v)
        return out, lse.contiguous().transpose(1, 2)  # [b, h_q, s_q], a view as the library returns

    if generation == "sgl":  # sgl-flash-mla: the new API, the SM90 kernels only with use_legacy=True
        def get_mla_metadata(*args, **kwargs):
            return _SchedMeta(), None

        def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                                   num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False,
                                   indices=None, attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None,
                                   topk_length=None, extra_topk_length=None, use_legacy=False):
            assert use_legacy, "sparse_decode_fwd: the default kernels need SM100"
            assert isinstance(tile_scheduler_metadata, _SchedMeta) and is_fp8_kvcache
            return _decode(q, k_cache, indices, softmax_scale, head_dim_v)

        def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None,
                                 use_legacy=False, return_log2_lse=None):
            assert use_legacy, "sparse_prefill_fwd: the default kernels need SM100"
            return _prefill(q, kv, indices, sm_scale, d_v)
    elif generation == "new":
        def get_mla_metadata(*args, **kwargs):
            return _SchedMeta(), None

        def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                                   num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False,
                                   indices=None, attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None,
                                   topk_length=None, extra_topk_length=None):
            meta = tile_scheduler_metadata
            assert isinstance(meta, _SchedMeta) and num_splits is None and not causal and is_fp8_kvcache
            config = (tuple(q.shape[:3]), k_cache.shape[1], indices.shape[-1])
            assert meta.config in (None, config), "input arguments are inconsistent with sched_meta"
            meta.config = config
            return _decode(q, k_cache, indices, softmax_scale, head_dim_v)

        def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None):
            return _prefill(q, kv, indices, sm_scale, d_v)
    else:
        def get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q=None,
                             is_fp8_kvcache=False, topk=None):
            assert cache_seqlens.dtype == torch.int32 and num_heads_k == 1 and is_fp8_kvcache and topk is not None
            return torch.zeros(8, 8, dtype=torch.int32), torch.zeros(cache_seqlens.numel() + 1, dtype=torch.int32)

        def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                                   num_splits, softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None):
            assert block_table.dtype == torch.int32 and block_table.shape[0] == q.shape[0]
            assert cache_seqlens.shape == (q.shape[0],) and num_splits.shape == (q.shape[0] + 1,)
            assert not causal and is_fp8_kvcache
            return _decode(q, k_cache, indices, softmax_scale, head_dim_v)

        def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512):
            return _prefill(q, kv, indices, sm_scale, d_v)

    mod.get_mla_metadata = get_mla_metadata
    mod.flash_mla_with_kvcache = flash_mla_with_kvcache
    mod.flash_mla_sparse_fwd = flash_mla_sparse_fwd
    return mod
