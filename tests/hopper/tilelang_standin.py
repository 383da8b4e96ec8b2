"""The ``tilelang`` backend's claims and wrapper on CPU, with PyTorch standing in for the compiled kernel and the
Triton combine: lets the conformance kit exercise the routing, padding, flat decode view and split bookkeeping
without a GPU (``tests/hopper/test_tilelang_backend.py``). The kernel itself is certified on the GPU."""

from __future__ import annotations

import torch

from dsa_runtime.backend import Backend
from dsa_runtime.capabilities import Capabilities
from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_attn import (
    TILELANG_SPARSE_ATTN_CLAIMS,
    TileLangSparseAttn,
)
from dsa_runtime.reference.kv_quant import unpack_mla_fp32
from dsa_runtime.reference.sparse_attn import ReferenceSparseAttn


class StandInTileLang(TileLangSparseAttn):
    """The real wrapper; ``_run`` is the reference with the kernel's conventions (fp32 partials and ``-inf``
    for an empty split), ``_combine`` the log-sum-exp merge in PyTorch. Small batches always split in two."""

    def __init__(self) -> None:
        super().__init__(decode_splits=None)

    def _run(self, q, kv, indices, sm_scale, split, decode=False):
        if indices.shape[0] != q.shape[0]:  # split rows: index row t over q row t % R
            q = q.repeat(indices.shape[0] // q.shape[0], 1, 1)
        if kv.dtype == torch.float8_e4m3fn:  # fp8_656 rows (decode): dequantised as the kernel's gather does
            assert decode and kv.dim() == 2 and kv.shape[-1] == 656, (decode, tuple(kv.shape))
            kv = unpack_mla_fp32(kv.view(torch.uint8), "fp8_656").bfloat16()
        out, lse = ReferenceSparseAttn().prefill(q, kv, indices, sm_scale)
        if split:
            return out.float(), torch.where(torch.isposinf(lse), float("-inf"), lse)
        return out, lse

    def decode(self, q, kv_cache, indices, sm_scale, *, layout, d_v=512):
        k = indices.shape[-1]
        self.decode_splits = 2 if k % 128 == 0 else 1
        return super().decode(q, kv_cache, indices, sm_scale, layout=layout, d_v=d_v)

    def _combine(self, part, part_lse):
        m = part_lse.max(dim=0).values
        empty = torch.isneginf(m)
        w = torch.exp(part_lse - torch.where(empty, 0.0, m)[None])
        total = torch.where(empty, 1.0, w.sum(0))
        out = (w[..., None] * part).sum(0) / total[..., None]
        lse = torch.where(empty, float("inf"), torch.where(empty, 0.0, m) + torch.log(total))
        return out.bfloat16(), lse


def backend() -> Backend:
    return Backend(
        name="tilelang_cpu_standin",
        capabilities=Capabilities(devices=frozenset({"cpu"}), methods=TILELANG_SPARSE_ATTN_CLAIMS),
        kernels={"sparse_attn": StandInTileLang},
    )
