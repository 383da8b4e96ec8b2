"""The ``moe`` family of the ``deepgemm`` backend: FP8 block-scaled experts on DeepGEMM's grouped GEMMs.

Pipeline of :meth:`DeepGEMMMoE.experts` (device-side, no host synchronisation unless the id check is on):

1. activations quantized per (token, 128 channels) with the checkpoint's scale rule (ue8m0 or float);
2. pairs ``(t, j)`` grouped per expert: for many tokens each expert's rows are padded to
   ``get_mk_alignment_for_contiguous_layout()`` (:func:`~.triton.moe_align.align_pairs`, pure torch) and run
   through ``m_grouped_fp8_gemm_nt_contiguous`` (padding rows carry expert ``-1`` and are skipped); for few
   tokens (decode) every expert gets a fixed ``[max_m]`` slab and ``m_grouped_fp8_gemm_nt_masked`` reads only
   ``masked_m[e]`` rows of each, so unchosen experts' weights are never read;
3. SwiGLU on the pairs' w13 outputs (fp32) and re-quantization per 128 with the same rule, in torch;
4. w2 through the same grouped GEMM; the weighted combine in fp32 (the contiguous path accumulates with
   ``index_add_``, the masked path sums each token's k rows in order).

The shared expert runs as its own one-expert pass with weight 1. Shapes DeepGEMM cannot take (hidden or
expert width not a multiple of 128) run :class:`~dsa_runtime.torch_kernels.moe.TorchMoE` instead.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import torch
from torch import Tensor

from dsa_runtime.families import QUANT_BLOCK, ExpertWeights, ScaleFmt, experts_out_dtype
from dsa_runtime.plugins.cuda_hopper.deepgemm_api import DeepGEMMAPI, load_api, tma_ready
from dsa_runtime.plugins.cuda_hopper.triton.moe_align import align_pairs
from dsa_runtime.torch_kernels.quant import quantize_blocks

ROW_CHUNK = 16384  # rows per fp32 SwiGLU / combine step on the contiguous path (~0.5 GiB at hidden 7168)
MASKED_ROW_ALIGN = 64  # slab height of the masked layout, rounded up to this (DeepGEMM's block M on SM90)


def _swiglu_quant(h13: Tensor, inter: int, fmt: str) -> tuple[Tensor, Tensor]:
    """``silu(h[:, :I]) * h[:, I:]`` in fp32, quantized per 128: ``[R, I]`` e4m3 and ``[R, I / 128]`` fp32."""
    g = h13[:, :inter].float()
    act = torch.nn.functional.silu(g).mul_(h13[:, inter:].float())
    return quantize_blocks(act, fmt)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=1)
def _triton_installed() -> bool:
    from dsa_runtime.hw_probe import module_available

    return module_available("triton")


def _triton_glue(t: Tensor) -> bool:
    """The Triton glue kernels run for ``t``: on CUDA with triton installed, or on CPU under Triton's interpreter
    (``TRITON_INTERPRET=1``, how the CPU tests check them); otherwise the torch glue."""
    return (t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1") and _triton_installed()


class _SortedRows(NamedTuple):
    """Both GEMMs' output over the expert-sorted rows and how rows and pairs map onto each other."""

    y: Tensor  # [rows, D] bf16, unweighted; padding rows unwritten
    pos: Tensor  # [T * k] int32: each pair's row in y, -1 when not computed
    pair: Tensor  # [rows] int64: each row's pair (0 for padding rows)
    valid: Tensor  # [rows] bool: the row holds a pair


def _weights(experts: ExpertWeights) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """DeepGEMM's SM90 B operands: ``[E, N, K]`` e4m3 K-major and TMA-aligned, scales ``[E, N/128, K/128]``
    fp32 contiguous (read without TMA)."""
    return (tma_ready(experts.w13), experts.w13_scale.float().contiguous(),  # type: ignore[union-attr]
            tma_ready(experts.w2), experts.w2_scale.float().contiguous())  # type: ignore[union-attr]


def _rows(x8: Tensor, idx: Tensor) -> Tensor:
    """``x8[idx]`` for e4m3 rows, gathered as bytes (fp8 index kernels are not on every device/version)."""
    return x8.view(torch.uint8)[idx].view(x8.dtype)


def _scatter_rows(src: Tensor, row: Tensor, rows: int) -> Tensor:
    """``[rows, C]`` e4m3 with ``src[i]`` at ``row[i]`` (other rows unset); copied as bytes (no e4m3 index_copy)."""
    out = torch.empty(rows, src.shape[1], dtype=torch.uint8, device=src.device)
    return out.index_copy_(0, row, src.view(torch.uint8)).view(src.dtype)


class DeepGEMMMoE:
    """``experts`` of :class:`dsa_runtime.families.MoEKernels` on DeepGEMM (FP8 weights with 128x128 scales).

    Args:
        scale_fmt: FP8 activation scale rule, ``"ue8m0"`` (V3.1/V3.2) or ``"float"`` (V3/R1); the contract's
            call carries none, so the model sets it here (or per call, ``scale_fmt=``).
        masked_max_tokens: token counts up to this use the masked (decode) GEMM, more the contiguous one.
        check_ids: raise ``ValueError`` on ids outside ``[-1, E)`` (one host sync; skipped under CUDA-graph
            capture). Bad ids are skipped like ``-1`` either way.
        api: DeepGEMM entry points (default: the installed ``deep_gemm``; tests inject a fake).
        decode: batches of at most ``masked_max_tokens`` on CUDA: ``"triton"`` (default) runs the Triton MoE
            kernels (faster there: 2.24 vs 3.92 ms at 64 tokens on the H200), ``"masked"`` DeepGEMM's masked
            grouped GEMM.
    """

    def __init__(
        self,
        scale_fmt: ScaleFmt = "ue8m0",
        *,
        masked_max_tokens: int = 64,
        check_ids: bool = True,
        api: DeepGEMMAPI | None = None,
        decode: str = "triton",
    ) -> None:
        if scale_fmt not in ("ue8m0", "float"):
            raise ValueError(f"unknown scale_fmt {scale_fmt!r}; valid: ue8m0, float")
        self.scale_fmt = scale_fmt
        self.masked_max_tokens = masked_max_tokens
        self.check_ids = check_ids
        if decode not in ("triton", "masked"):
            raise ValueError(f"unknown decode path {decode!r}; valid: triton, masked")
        self.decode = decode
        self._triton: dict[str, object] = {}
        self.api = api or load_api()

    def experts(
        self,
        x: Tensor,
        topk_weights: Tensor,
        topk_ids: Tensor,
        experts: ExpertWeights,
        shared: ExpertWeights | None = None,
        *,
        scale_fmt: ScaleFmt | None = None,
        out_dtype: torch.dtype | None = None,
    ) -> Tensor:
        """See :meth:`dsa_runtime.families.MoEKernels.experts`: ``[T, D]`` in ``out_dtype`` (bf16 by default;
        float32: the fp32 sum before its rounding, of bf16 down-projection rows on the DeepGEMM paths)."""
        out_dtype = experts_out_dtype(out_dtype)
        fmt = scale_fmt or self.scale_fmt
        if x.dim() != 2:
            raise ValueError(f"x must be [T, D], got shape {tuple(x.shape)}")
        tokens, dim = x.shape
        n_exp, two_inter, wdim = experts.w13.shape
        inter = two_inter // 2
        if wdim != dim or experts.w2.shape != (n_exp, dim, inter):
            raise ValueError(
                f"expert shapes w13 {tuple(experts.w13.shape)}, w2 {tuple(experts.w2.shape)} do not fit x [T, {dim}]"
            )
        if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != tokens:
            raise ValueError(f"topk ids {tuple(topk_ids.shape)} / weights {tuple(topk_weights.shape)} vs {tokens} tokens")
        if not experts.is_fp8 or dim % QUANT_BLOCK or inter % QUANT_BLOCK or (shared is not None and not shared.is_fp8):
            from dsa_runtime.torch_kernels.moe import TorchMoE  # outside DeepGEMM's layouts: plain torch

            return TorchMoE().experts(x, topk_weights, topk_ids, experts, shared, out_dtype=out_dtype)
        ids = topk_ids.to(device=x.device, dtype=torch.int32)
        bad = (ids < -1) | (ids >= n_exp)
        ids = torch.where(bad, -1, ids)
        if tokens <= self.masked_max_tokens and self.decode == "triton" and x.is_cuda and _triton_glue(x):
            # Decode-sized batches: the Triton kernels stream only the chosen experts' weights at the copy
            # ceiling (64 tokens: 2.24 ms on the H200) where DeepGEMM's masked layout took 3.92 ms.
            return self._triton_moe(fmt).experts(x, topk_weights, topk_ids, experts, shared, out_dtype=out_dtype)
        if tokens > self.masked_max_tokens and _triton_glue(x):
            y = self._prefill_cuda(x, topk_weights, ids, experts, shared, fmt, out_dtype)
            if self.check_ids and bool(bad.any()):
                raise ValueError(f"expert ids must be -1 or in [0, {n_exp})")
            return y
        out = torch.zeros(tokens, dim, dtype=torch.float32, device=x.device)
        if tokens:
            x8, xs = quantize_blocks(x, fmt)  # type: ignore[arg-type]
            wts = topk_weights.to(device=x.device, dtype=torch.float32)
            self._grouped(x8, xs, wts, ids, experts, fmt, out)
            if shared is not None:
                ones = torch.ones(tokens, 1, dtype=torch.float32, device=x.device)
                zeros = torch.zeros(tokens, 1, dtype=torch.int32, device=x.device)
                self._grouped(x8, xs, ones, zeros, shared, fmt, out)
        capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
        if self.check_ids and not capturing and bool(bad.any()):
            raise ValueError(f"expert ids must be -1 or in [0, {n_exp})")
        return out.to(out_dtype)

    def _grouped(
        self, x8: Tensor, xs: Tensor, wts: Tensor, ids: Tensor, experts: ExpertWeights, fmt: str, out: Tensor
    ) -> None:
        """Add ``sum_j wts[t, j] * E_{ids[t, j]}(x[t])`` into ``out`` ``[T, D]`` fp32."""
        w13, s13, w2, s2 = _weights(experts)
        if x8.shape[0] <= self.masked_max_tokens:
            left = self._masked(x8, xs, wts, ids, (w13, s13, w2, s2), fmt, out)
            capturing = x8.is_cuda and torch.cuda.is_current_stream_capturing()
            if self.check_ids and not capturing and bool(left.any()):
                # A token listing one expert twice (never from routing): add the pairs that did not fit.
                rest = torch.where(left.view(ids.shape), ids, -1)
                self._contiguous(x8, xs, wts, rest, (w13, s13, w2, s2), fmt, out)
        else:
            self._contiguous(x8, xs, wts, ids, (w13, s13, w2, s2), fmt, out)

    def _prefill_cuda(
        self, x: Tensor, topk_weights: Tensor, ids: Tensor, experts: ExpertWeights, shared: ExpertWeights | None,
        fmt: str, out_dtype: torch.dtype,
    ) -> Tensor:
        """Many tokens on CUDA: DeepGEMM's contiguous grouped GEMMs with Triton glue (SwiGLU + re-quantization
        in one pass, one weighted combine of the expert-sorted rows straight to ``out_dtype``). The torch glue cost more
        than both GEMMs together at 8192 tokens on the H200 (26 ms vs 7.2 ms of DeepGEMM kernels)."""
        from dsa_runtime.plugins.cuda_hopper.triton.moe_gemm import combine_sorted
        from dsa_runtime.plugins.cuda_hopper.triton.moe_quant import quantize_rows

        tokens, dim = x.shape
        x8, xs = quantize_rows(x.contiguous(), fmt)
        y, pos, _, _ = self._contiguous_rows(x8, xs, ids, _weights(experts), fmt)
        ys, pos_s = y, pos
        if shared is not None:
            zeros = torch.zeros(tokens, 1, dtype=torch.int32, device=x.device)
            ys, pos_s, _, _ = self._contiguous_rows(x8, xs, zeros, _weights(shared), fmt)
        wts = topk_weights.to(device=x.device, dtype=torch.float32).contiguous()
        out = torch.empty(tokens, dim, dtype=out_dtype, device=x.device)  # combine_sorted stores in out's dtype
        block = 1024
        combine_sorted[(tokens, -(-dim // block))](
            y, pos, wts, ys, pos_s, out, dim, y.stride(0), ys.stride(0), out.stride(0),
            TOPK=ids.shape[1], HAS_SHARED=shared is not None, BLOCK_N=block, num_warps=4,
        )
        return out

    def _triton_moe(self, fmt: str):
        """The Triton MoE for decode-sized batches (one per scale rule, made on first use)."""
        from dsa_runtime.plugins.cuda_hopper.triton.moe_experts import TritonMoE

        if fmt not in self._triton:
            self._triton[fmt] = TritonMoE(fmt, check_ids=self.check_ids)  # type: ignore[arg-type]
        return self._triton[fmt]

    def _contiguous_rows(self, x8: Tensor, xs: Tensor, ids: Tensor, w: tuple, fmt: str) -> _SortedRows:
        """Both GEMMs over the pairs sorted per expert (:class:`_SortedRows`)."""
        w13, s13, w2, s2 = w
        n_exp, two_inter, dim = w13.shape
        top_k = ids.shape[1]
        n_pairs = ids.numel()
        blocks = align_pairs(ids.reshape(-1), n_exp, self.api.mk_alignment())
        pair = blocks.sorted_pairs.long()
        valid = pair < n_pairs
        m_indices = blocks.block_expert.repeat_interleave(blocks.block_m)
        m_indices = torch.where(valid, m_indices, -1).to(torch.int32).contiguous()
        rows = pair.shape[0]
        slot = torch.where(valid, pair, n_pairs)  # padding rows -> one dump entry past the pairs
        pos = torch.full((n_pairs + 1,), -1, dtype=torch.int32, device=x8.device)
        pos.scatter_(0, slot, torch.arange(rows, dtype=torch.int32, device=x8.device))
        pair = torch.where(valid, pair, 0)
        tok = pair // top_k
        h13 = torch.empty(rows, two_inter, dtype=torch.bfloat16, device=x8.device)
        self.api.grouped_contiguous(_rows(x8, tok), xs[tok].contiguous(), w13, s13, h13, m_indices)
        inter = two_inter // 2
        if _triton_glue(h13):
            from dsa_runtime.plugins.cuda_hopper.triton.moe_quant import swiglu_quantize_rows

            h8, hs = swiglu_quantize_rows(h13, fmt)
        else:
            h8 = torch.empty(rows, inter, dtype=torch.float8_e4m3fn, device=x8.device)
            hs = torch.empty(rows, inter // QUANT_BLOCK, dtype=torch.float32, device=x8.device)
            for r0 in range(0, rows, ROW_CHUNK):  # fp32 temporaries bounded to ROW_CHUNK rows at prefill
                h8[r0 : r0 + ROW_CHUNK], hs[r0 : r0 + ROW_CHUNK] = _swiglu_quant(h13[r0 : r0 + ROW_CHUNK], inter, fmt)
        del h13
        y = torch.empty(rows, dim, dtype=torch.bfloat16, device=x8.device)
        self.api.grouped_contiguous(h8, hs, w2, s2, y, m_indices)
        return _SortedRows(y, pos[:n_pairs], pair, valid)

    def _contiguous(self, x8: Tensor, xs: Tensor, wts: Tensor, ids: Tensor, w: tuple, fmt: str, out: Tensor) -> None:
        """Add the pairs' weighted expert outputs into ``out`` ``[T, D]`` fp32 (torch glue)."""
        y, _, pair, valid = self._contiguous_rows(x8, xs, ids, w, fmt)
        rows = y.shape[0]
        tok = pair // ids.shape[1]
        w_row = wts.reshape(-1)[pair]
        for r0 in range(0, rows, ROW_CHUNK):
            sl = slice(r0, r0 + ROW_CHUNK)
            # Padding rows are never written by DeepGEMM (garbage): masked, not multiplied by a zero weight.
            contrib = torch.where(valid[sl, None], y[sl].float() * w_row[sl, None], 0.0)
            out.index_add_(0, tok[sl], contrib)

    def _masked(self, x8: Tensor, xs: Tensor, wts: Tensor, ids: Tensor, w: tuple, fmt: str, out: Tensor) -> Tensor:
        """Decode path; returns ``[T * k]`` bool: pairs that did not fit their expert's slab (duplicates)."""
        w13, s13, w2, s2 = w
        n_exp, two_inter, dim = w13.shape
        tokens, top_k = ids.shape
        dev = x8.device
        flat = ids.reshape(-1).long()
        key = torch.where(flat >= 0, flat, n_exp)
        counts = torch.zeros(n_exp + 1, dtype=torch.long, device=dev).scatter_add_(0, key, torch.ones_like(key))
        order = torch.argsort(key, stable=True)
        start = torch.cumsum(counts, 0) - counts
        rank = torch.empty_like(key)
        rank[order] = torch.arange(key.numel(), device=dev) - start[key[order]]
        # Routing picks distinct experts per token, so no expert gets more than `tokens` rows. A row listing one
        # expert twice would overflow its slab: such pairs (rank >= max_m) are counted in `overflow` and the
        # call is redone on the contiguous path (one host read, only when check_ids is on).
        max_m = -(-tokens // MASKED_ROW_ALIGN) * MASKED_ROW_ALIGN
        slab = n_exp * max_m
        fits = (flat >= 0) & (rank < max_m)
        row = torch.where(fits, key * max_m + rank, slab)  # invalid pairs -> one trailing dump row
        tok = torch.arange(tokens * top_k, device=dev) // top_k
        a = _scatter_rows(_rows(x8, tok), row, slab + 1)
        # Scale rows past masked_m are read by the last row block of each expert: zeros, as DeepGEMM's own tests
        # give (garbage there stays in rows we never read, but a NaN/denormal pattern is not worth the doubt).
        a_s = torch.zeros(slab + 1, xs.shape[1], dtype=torch.float32, device=dev).index_copy_(0, row, xs[tok])
        masked_m = counts[:n_exp].clamp(max=max_m).to(torch.int32)
        expected_m = max(1, -(-tokens * top_k // n_exp))
        h13 = torch.empty(n_exp, max_m, two_inter, dtype=torch.bfloat16, device=dev)
        self.api.grouped_masked(
            a[:slab].view(n_exp, max_m, dim), a_s[:slab].view(n_exp, max_m, -1), w13, s13, h13, masked_m, expected_m
        )
        h8_pairs, hs_pairs = _swiglu_quant(h13.view(slab, two_inter)[row.clamp(max=slab - 1)], two_inter // 2, fmt)
        inter = two_inter // 2
        h8 = _scatter_rows(h8_pairs, row, slab + 1)
        hs = torch.zeros(slab + 1, hs_pairs.shape[1], dtype=torch.float32, device=dev).index_copy_(0, row, hs_pairs)
        y = torch.empty(n_exp, max_m, dim, dtype=torch.bfloat16, device=dev)
        self.api.grouped_masked(
            h8[:slab].view(n_exp, max_m, inter), hs[:slab].view(n_exp, max_m, -1), w2, s2, y, masked_m, expected_m
        )
        y_pairs = y.view(slab, dim)[row.clamp(max=slab - 1)].float() * wts.reshape(-1, 1)
        y_pairs = torch.where(fits[:, None], y_pairs, 0.0)
        out.add_(y_pairs.view(tokens, top_k, dim).sum(dim=1))
        return (flat >= 0) & ~fits
