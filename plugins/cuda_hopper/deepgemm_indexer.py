"""The ``indexer`` family of the ``deepgemm`` backend: layout translation onto DeepGEMM's MQA-logits kernels.

* ``logits_ragged``: our ``(q8 [T, H, 128], weights [T, H], k8 [S, 128], k_scale [S], ks, ke)`` is exactly
  DeepGEMM's ``(q, (kv, kv_scale), weights, cu_seq_len_k_start, cu_seq_len_k_end)``; DeepGEMM computes
  ``sum_h w[t, h] * relu(q . k * k_scale)`` (= ours, the scale being positive) and with ``clean_logits`` fills
  ``-inf`` outside each row's ``[ks, ke)``, the whole row included (``smxx_clean_logits``).
* ``logits_paged``: our ``index_k_132`` page ``[page_size * 132]`` bytes (64 x 128 e4m3 token-major, then 64
  fp32 scales) is byte for byte DeepGEMM's fused block ``[64, 1, 132]``, so the cache is only re-viewed. The
  causal limit of query ``j`` (``p < context_len - N + j + 1``) is applied here with one masked fill: DeepGEMM
  computes every position below the request's length for both MTP queries and leaves the rest of the row
  unwritten (``clean_logits`` is refused with the 2-D lengths of its newer API).

No host synchronisation: the 2-D lengths, the mask and the schedule metadata are device tensors; the metadata
kernel reads the lengths on the device.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.families import INDEX_HEAD_DIM, INDEX_K_ROW_BYTES
from dsa_runtime.plugins.cuda_hopper.deepgemm_api import PAGED_BLOCK, DeepGEMMAPI, load_api, tma_ready

E4M3 = torch.float8_e4m3fn


class DeepGEMMIndexer:
    """``logits_ragged`` / ``logits_paged`` of :class:`dsa_runtime.families.IndexerKernels` through DeepGEMM.

    Args:
        api: the DeepGEMM entry points (default: the installed ``deep_gemm``; tests inject a fake).
    """

    def __init__(self, api: DeepGEMMAPI | None = None) -> None:
        self.api = api or load_api()

    def logits_ragged(
        self, q8: Tensor, weights: Tensor, k8: Tensor, k_scale: Tensor, ks: Tensor, ke: Tensor
    ) -> Tensor:
        """``[T, S]`` fp32 logits, ``-inf`` outside ``ks[t] <= s < ke[t]`` (see the family contract)."""
        if q8.dim() != 3 or q8.shape[-1] != INDEX_HEAD_DIM or k8.dim() != 2 or k8.shape[-1] != INDEX_HEAD_DIM:
            raise ValueError(f"need q8 [T, H, 128] and k8 [S, 128], got {tuple(q8.shape)} and {tuple(k8.shape)}")
        s_total = k8.shape[0]
        dev = q8.device
        # DeepGEMM reads int32 windows; clamp to [0, S] as the reference does (the contract allows S).
        ks32 = ks.to(device=dev, dtype=torch.int32).clamp(0, s_total).contiguous()
        # An empty window (ke < ks) as ke == ks: the kernel takes [min ks, max ke) of a query block in unsigned
        # arithmetic, and -inf is all that either form yields.
        ke32 = torch.maximum(ke.to(device=dev, dtype=torch.int32).clamp(0, s_total), ks32).contiguous()
        if q8.shape[0] == 0 or s_total == 0:
            return torch.full((q8.shape[0], s_total), float("-inf"), dtype=torch.float32, device=dev)
        if k_scale.dim() != 1 or k_scale.shape[0] != s_total:
            k_scale = k_scale.reshape(s_total)  # [S, 1] -> [S]: DeepGEMM takes a 1-D fp32 scale per key
        # q, k, their scales and the weights are TMA operands: contiguous, 16-byte aligned.
        return self.api.mqa_logits(
            tma_ready(q8), tma_ready(k8), tma_ready(k_scale.float()), tma_ready(weights.float()), ks32, ke32
        )

    def logits_paged(
        self,
        q8: Tensor,
        weights: Tensor,
        index_cache: Tensor,
        context_lens: Tensor,
        block_table: Tensor,
        max_context_len: int,
    ) -> Tensor:
        """``[B * N, max_context_len]`` fp32; query j of request b sees ``p < context_lens[b] - N + j + 1``."""
        batch, n_q, heads, dim = q8.shape
        if dim != INDEX_HEAD_DIM:
            raise ValueError(f"q8 must be [B, N, H, 128], got {tuple(q8.shape)}")
        page_bytes = PAGED_BLOCK * INDEX_K_ROW_BYTES
        if index_cache.dim() != 2 or index_cache.shape[1] != page_bytes:
            raise ValueError(f"DeepGEMM needs index_k_132 pages of 64 tokens ([pages, {page_bytes}] uint8), "
                             f"got {tuple(index_cache.shape)}")
        dev = q8.device
        lens = context_lens.to(device=dev, dtype=torch.int32)
        # Query j's own length: the last N cache tokens are the N new queries, in order.
        limit = lens[:, None] - n_q + 1 + torch.arange(n_q, device=dev, dtype=torch.int32)[None, :]
        # The kernel must never see a negative length (read as unsigned) nor one past the output width (it would
        # write beyond its row): clamped here, while the mask below keeps the exact limit.
        kernel_lens = (limit if self.api.two_d_lens else lens).clamp(0, max_context_len).to(torch.int32).contiguous()
        if index_cache.dtype != torch.uint8 or index_cache.stride(1) != 1 or index_cache.stride(0) % 16 \
                or index_cache.data_ptr() % 16:
            raise ValueError("DeepGEMM reads the index cache as uint8 pages with 16-byte aligned base and page stride, "
                             f"got {index_cache.dtype} strides {index_cache.stride()} at offset {index_cache.data_ptr() % 16}")
        # DeepGEMM's fused layout [blocks, 64, 1, 132] uint8: stride(1) == 132, stride(3) == 1 (attention.hpp).
        kv = index_cache.view(index_cache.shape[0], PAGED_BLOCK, 1, INDEX_K_ROW_BYTES)
        table = block_table.to(device=dev, dtype=torch.int32)
        if table.stride(-1) != 1:
            table = table.contiguous()
        schedule = self.api.paged_metadata(kernel_lens, self.api.num_sms())
        logits = self.api.paged_logits(
            tma_ready(q8), kv, tma_ready(weights.float().reshape(batch * n_q, heads)), kernel_lens, table, schedule,
            max_context_len,
        )
        pos = torch.arange(max_context_len, device=dev, dtype=torch.int32)
        return logits.masked_fill_(pos[None, :] >= limit.reshape(-1, 1), float("-inf"))
