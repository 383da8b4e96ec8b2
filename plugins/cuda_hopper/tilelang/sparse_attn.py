"""The ``sparse_attn`` family of the ``tilelang`` backend: our own TileLang sparse MLA kernel.

* :meth:`TileLangSparseAttn.prefill`: :func:`.sparse_mla.compiled` over the flat bf16 KV buffer.
* :meth:`TileLangSparseAttn.decode`: the flat view of the paged cache is exactly the prefill problem with
  ``T = B * Q`` rows; small batches split the index list into ``n`` chunks (each chunk a row of its own, fp32
  partial outputs) merged by the Triton combine (:mod:`..triton.sparse_mla_combine`). ``layout="bf16"`` runs the
  bf16 kernels; ``layout="fp8_656"`` runs :data:`.sparse_mla.FP8_DECODE_CONFIG` (``wsf8c``, 128 heads; 64 heads
  run :data:`.sparse_mla.FP8_DECODE_CONFIG_64`, ``wsf8h``) or another of :data:`.sparse_mla.FP8_VARIANTS`, whose
  gather warpgroup dequantises the 656-byte rows (:mod:`.gather_fp8`) into fp16 (``wsf8h`` / ``wsf8c``: the
  query and the rows must lie within fp16's range, +-65504) or bf16 operands.

Claims are exactly what the kernels run: d_qk 576 / d_v 512, bf16 KV (prefill and decode) or the ``fp8_656``
cache (decode only), 64 or 128 heads (one 64-head tile per block; the core pads 16 or 32 heads per rank up to 64)
and k a multiple of 64 (one gathered chunk; the core pads k with ``-1``). Anything else resolves to another
backend with the logged reason.

This module imports neither torch nor tilelang at import time: the plugin reads :data:`TILELANG_SPARSE_ATTN_CLAIMS`
while registering backends, which must stay cheap.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from typing import TYPE_CHECKING

from dsa_runtime.capabilities import MethodClaim, ValueSet
from dsa_runtime.families import D_QK, D_V, FP8_MLA_ROW_BYTES, MLALayout, check_mla_cache

if TYPE_CHECKING:
    from torch import Tensor

    from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla import TLConfig

HEADS = ValueSet.one_of(64, 128)
K_VALUES = ValueSet.multiples(64, 64, 16384)
TILELANG_SPARSE_ATTN_CLAIMS: dict[str, MethodClaim] = {
    "sparse_attn.prefill": MethodClaim(kv_layouts=ValueSet.one_of("bf16"), heads=HEADS, k=K_VALUES),
    "sparse_attn.decode": MethodClaim(kv_layouts=ValueSet.one_of("bf16", "fp8_656"), heads=HEADS, k=K_VALUES),
}
# Launch shape by label (e.g. ``ws_i64_s2_t384``), to run another candidate of .sparse_mla.CANDIDATES everywhere
# (conformance, engine) without a code change, once bench/sparse_attn_tilelang.py has measured it. An fp8_656
# candidate (``ws4f8`` / ``wsf8`` / ``wsf8h`` / ``wsf8c``) replaces only the FP8-cache decode kernel, any other only
# the bf16 ones.
CONFIG_ENV = "DSA_TILELANG_SPARSE_MLA"
INSTALL_HINT = "pip install 'dsa-runtime[hopper]'; offline GPU hosts: tools/gpu/pack_tilelang.sh, see docs/hopper.md"
# Decode splits: at ~226 KB of shared memory one block runs per SM, so split until the (row, head block, split)
# blocks fill one wave of an H100's 132 SMs, with chunks of at least MIN_CHUNK indices.
TARGET_BLOCKS = 132
MAX_SPLITS = 16
MIN_CHUNK = 128


def tilelang_library() -> tuple[bool, str]:
    """Whether ``tilelang`` can be imported, checked without importing it (nor torch)."""
    if sys.modules.get("tilelang") is not None:
        return True, "tilelang imported"
    try:
        spec = importlib.util.find_spec("tilelang")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return False, f"the tilelang package is not installed ({INSTALL_HINT})"
    return True, f"tilelang found at {spec.origin}"


def tilelang_available() -> tuple[bool, str]:
    """``tilelang`` installed and an SM90 GPU visible (NVML probe): the kernel uses wgmma, sm_90a only."""
    from dsa_runtime.plugins.cuda_hopper import on_sm90

    return on_sm90(tilelang_library())


def config_from_env() -> TLConfig | None:
    """The candidate whose label ``$DSA_TILELANG_SPARSE_MLA`` names (None when unset; ValueError when unknown)."""
    label = os.environ.get(CONFIG_ENV)
    if not label:
        return None
    from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla import CANDIDATES

    for cfg in CANDIDATES:
        if cfg.label() == label:
            return cfg
    raise ValueError(f"{CONFIG_ENV}={label!r} names no candidate; valid: {', '.join(c.label() for c in CANDIDATES)}")


def plan_splits(rows: int, heads: int, k: int) -> int:
    """Index-list splits for ``rows`` query rows: 1 once ``rows * heads / 64`` blocks fill the GPU, else the
    largest power of two (<= 16) that keeps one wave and chunks of >= 128 indices, a multiple of 64 each."""
    blocks = rows * (heads // 64)
    n = 1
    while (n < MAX_SPLITS and blocks * n * 2 <= TARGET_BLOCKS and k % (2 * n * 64) == 0
           and k // (2 * n) >= MIN_CHUNK):
        n *= 2
    return n


class TileLangSparseAttn:
    """:class:`dsa_runtime.families.SparseAttnKernels` with our TileLang kernel on SM90.

    Args:
        config: fixed launch shape for every call (default: the candidate named by ``$DSA_TILELANG_SPARSE_MLA``,
            else :data:`.sparse_mla.DEFAULT_CONFIG` for prefill and :data:`.sparse_mla.DECODE_CONFIG` for decode).
        decode_splits: fixed number of index-list splits in decode (default: :func:`plan_splits`).
    """

    def __init__(self, config: TLConfig | None = None, decode_splits: int | None = None) -> None:
        self.config = config or config_from_env()
        self.decode_splits = decode_splits

    def _config(self, k: int, decode: bool = False, fp8: bool = False, heads: int = 128) -> TLConfig:
        from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla import (
            DECODE_CONFIG,
            DEFAULT_CONFIG,
            FP8_DECODE_CONFIG,
            FP8_DECODE_CONFIG_64,
            FP8_VARIANTS,
        )

        mine = self.config is not None and (self.config.variant in FP8_VARIANTS) == fp8
        if fp8:
            cfg = self.config if mine else FP8_DECODE_CONFIG
            # wsf8c pairs the two 64-head blocks of 128 heads: one block runs the unpaired schedule
            return FP8_DECODE_CONFIG_64 if cfg.variant == "wsf8c" and heads != 128 else cfg
        cfg = self.config if mine else (DECODE_CONFIG if decode else DEFAULT_CONFIG)
        if k % cfg.block_i and k % 64 == 0 and cfg.variant == "pipe":
            cfg = dataclasses.replace(cfg, block_i=64)  # a chunk wider than k's step: the claimed step fits
        return cfg

    def _run(self, q: Tensor, kv: Tensor, indices: Tensor, sm_scale: float, split: bool,
             decode: bool = False) -> tuple[Tensor, Tensor]:
        """q ``[R, H, 576]``, kv ``[S, 576]`` bf16 or ``[S, 656]`` ``float8_e4m3fn`` (the ``fp8_656`` rows viewed
        as e4m3: decode only), indices ``[R, K]`` -> out ``[R, H, 512]`` (bf16, or fp32 with ``split``) and lse
        ``[R, H]`` (``+inf`` when empty, ``-inf`` with ``split``). ``split`` also takes indices ``[n * R, K]``
        (``n`` splits of each row): row ``t`` then uses q row ``t % R``, read in place (out ``[n * R, ...]``)."""
        import torch

        from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla import compiled

        rows, heads, width = q.shape
        k = indices.shape[-1]
        fp8 = kv.dtype == torch.float8_e4m3fn
        kv_width = FP8_MLA_ROW_BYTES if fp8 else D_QK
        if width != D_QK or kv.dim() != 2 or kv.shape[-1] != kv_width:
            raise ValueError(f"tilelang sparse MLA needs q [T, H, {D_QK}] and kv [S, {kv_width}], got "
                             f"{tuple(q.shape)} and {tuple(kv.shape)}")
        if indices.dim() != 2 or not (indices.shape[0] == rows or (split and rows and indices.shape[0] % rows == 0)):
            raise ValueError(f"tilelang sparse MLA needs indices [T, K] with T = {rows}"
                             f"{' (or n x that, split)' if split else ''}, got {tuple(indices.shape)}")
        q_rows, rows = rows, indices.shape[0]  # split: the program's rows are the index rows
        if q.dtype != torch.bfloat16 or kv.dtype not in (torch.bfloat16, torch.float8_e4m3fn):
            raise ValueError(f"tilelang sparse MLA runs bf16 q and bf16 or fp8_656 kv, got {q.dtype} and {kv.dtype}")
        if fp8 and not decode:
            raise ValueError("tilelang sparse MLA reads the fp8_656 cache in decode only")
        out_dtype = torch.float32 if split else torch.bfloat16
        out = torch.empty(rows, heads, D_V, dtype=out_dtype, device=q.device)
        lse = torch.empty(rows, heads, dtype=torch.float32, device=q.device)
        if rows == 0 or q_rows == 0:
            return out, lse
        if kv.shape[0] == 0 or k == 0:  # nothing can be selected: the empty-query convention
            out.zero_()
            lse.fill_(float("-inf") if split else float("inf"))
            return out, lse
        kern = compiled(heads, k, float(sm_scale), self._config(k, decode, fp8, heads), split)
        kern(q.contiguous(), kv.contiguous(), indices.to(torch.int32).contiguous(), out, lse)
        return out, lse

    def prefill(
        self, q: Tensor, kv: Tensor, indices: Tensor, sm_scale: float, d_v: int = D_V
    ) -> tuple[Tensor, Tensor]:
        """q ``[T, H, 576]`` bf16, kv ``[S, 576]`` bf16, indices ``[T, K]`` int32 -> out ``[T, H, 512]`` bf16,
        lse ``[T, H]`` fp32 (natural log; ``+inf`` and zeros for a query with no valid index)."""
        if d_v != D_V:
            raise ValueError(f"tilelang sparse MLA runs d_v {D_V}, got {d_v}")
        return self._run(q, kv, indices, sm_scale, split=False)

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
        """q ``[B, Q, H, 576]`` bf16, cache ``[pages, page_size, 576]`` bf16 (``layout="bf16"``) or
        ``[pages, page_size, 656]`` uint8 (``layout="fp8_656"``), indices ``[B, Q, K]`` int32 slots -> out
        ``[B, Q, H, 512]`` bf16, lse ``[B, Q, H]`` fp32."""
        import torch

        check_mla_cache(kv_cache, layout)
        if d_v != D_V:
            raise ValueError(f"tilelang sparse MLA runs d_v {D_V}, got {d_v}")
        b, n_q, heads, _ = q.shape
        k = indices.shape[-1]
        rows = b * n_q
        flat_q = q.reshape(rows, heads, D_QK)
        flat_kv = kv_cache.reshape(-1, kv_cache.shape[-1])
        if layout == "fp8_656":  # the kernel reads the rows as e4m3 bytes (scales and rope through views)
            flat_kv = flat_kv.view(torch.float8_e4m3fn)
        flat_idx = indices.reshape(rows, k)
        n = self.decode_splits or plan_splits(rows, heads, k)
        if n <= 1:
            out, lse = self._run(flat_q, flat_kv, flat_idx, sm_scale, split=False, decode=True)
            return out.view(b, n_q, heads, D_V), lse.view(b, n_q, heads)
        if k % (n * 64):
            raise ValueError(f"decode splits {n} need k a multiple of {n * 64}, got {k}")
        # Split s of row r is row s * rows + r of a problem with n * rows rows and k / n indices each; the program
        # reads q row r in place (at one row, the indices' reshape is a view too: no copy at all).
        sidx = flat_idx.reshape(rows, n, k // n).transpose(0, 1).reshape(n * rows, k // n)
        part, part_lse = self._run(flat_q, flat_kv, sidx, sm_scale, split=True, decode=True)
        out, lse = self._combine(part.view(n, rows, heads, D_V), part_lse.view(n, rows, heads))
        return out.view(b, n_q, heads, D_V), lse.view(b, n_q, heads)

    def _combine(self, part: Tensor, part_lse: Tensor) -> tuple[Tensor, Tensor]:
        """Merge split partials (part ``[n, T, H, 512]`` fp32, lse ``[n, T, H]``, ``-inf`` when empty) with the
        Triton combine kernel (triton ships with torch on CUDA)."""
        from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_combine import combine_splits

        return combine_splits(part, part_lse, pdl=True)  # the split programs trigger it (.pdl)
