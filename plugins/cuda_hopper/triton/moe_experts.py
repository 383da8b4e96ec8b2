"""The ``moe`` family of the ``triton`` backend: fused routing and grouped SwiGLU experts (bf16 or FP8).

Pipeline of :meth:`TritonMoE.experts` (every step on the device, no host synchronisation unless the id check
is on): pairs ``(t, j)`` grouped per expert (:mod:`.moe_align`; ``-1`` ids dropped there); for FP8 weights
the activations quantized per (token, 128 channels) with the checkpoint's scale rule (:mod:`.moe_quant`);
:func:`~.moe_gemm.gemm_up` (w13 with SwiGLU fused, ``h`` re-quantized in its epilogue);
:func:`~.moe_gemm.gemm_down` (w2, scaled by the routing weight); :func:`~.moe_gemm.combine` (fixed-order
fp32 sum per token). The shared expert rides in the same launches as expert ``E`` with weight 1 when its
weights have the routed experts' dtype (``fuse_shared``), else it runs as its own one-expert pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from torch import Tensor

from dsa_runtime.families import ExpertWeights, ScaleFmt, experts_out_dtype
from dsa_runtime.plugins.cuda_hopper.triton import moe_gemm
from dsa_runtime.plugins.cuda_hopper.triton.moe_align import align_pairs
from dsa_runtime.plugins.cuda_hopper.triton.moe_align_small import align_pairs_small
from dsa_runtime.plugins.cuda_hopper.triton.moe_align_small import fits as small_align_fits
from dsa_runtime.plugins.cuda_hopper.triton.moe_quant import INTERPRET, quantize_rows
from dsa_runtime.plugins.cuda_hopper.triton.moe_route import route as fused_route


@dataclass(frozen=True)
class TileConfig:
    """Launch shape of the two grouped GEMMs (``block_k`` must be 128 for FP8: one scale block per step)."""

    block_m: int
    block_n_up: int = 128
    block_n_down: int = 128
    block_k: int = 128
    warps_up: int = 4
    stages_up: int = 3
    warps_down: int = 4
    stages_down: int = 3
    group_m: int = 1
    split_n: bool = False


def default_config(rows_per_expert: float, fp8: bool) -> TileConfig:
    """Tiles by the expected rows per used expert (measured on an H100, docs/benchmarks.md): 16-row blocks
    at decode (memory-bound: 4 warps, 3 stages), 64-row blocks for FP8 prefill (two 64x128 fp32 accumulators
    per program; 128 rows spill), 128-row blocks for bf16 prefill."""
    if not fp8:
        if rows_per_expert <= 16:
            return TileConfig(16, block_k=64, stages_up=4, stages_down=4)
        if rows_per_expert <= 64:
            return TileConfig(32 if rows_per_expert <= 32 else 64, block_k=64, stages_up=4, stages_down=4)
        return TileConfig(128, block_k=64, warps_up=8, stages_up=3, warps_down=8, stages_down=3)
    if rows_per_expert <= 16:
        return TileConfig(16, stages_up=3, stages_down=3)
    if rows_per_expert <= 32:
        return TileConfig(32, stages_up=3, stages_down=3)
    return TileConfig(64, warps_up=4, stages_up=3, warps_down=4, stages_down=4, group_m=16, split_n=True)


class TritonMoE:
    """:class:`dsa_runtime.families.MoEKernels` in Triton for SM90.

    Args:
        scale_fmt: FP8 activation scale rule, ``"ue8m0"`` (V3.1/V3.2) or ``"float"`` (V3/R1). The contract's
            ``experts`` call carries no scale rule, so the model sets it here (or per call, ``scale_fmt=``).
        fuse_shared: run the shared expert inside the routed launches (one more expert, weight 1).
        check_ids: raise ``ValueError`` on ids outside ``[-1, E)``. Off by default: the check costs a host
            sync per call (per MoE layer in eager decode, where it stalls the launch queue), and ids come from
            :meth:`route`. Bad ids are skipped like ``-1`` either way, never dereferenced. Skipped while a CUDA
            graph is being captured.
        config: fixed tiles (default: chosen per call by :func:`default_config`).
    """

    def __init__(
        self,
        scale_fmt: ScaleFmt = "ue8m0",
        *,
        fuse_shared: bool = True,
        check_ids: bool = False,
        config: TileConfig | None = None,
    ) -> None:
        if scale_fmt not in ("ue8m0", "float"):
            raise ValueError(f"unknown scale_fmt {scale_fmt!r}; valid: ue8m0, float")
        self.scale_fmt = scale_fmt
        self.fuse_shared = fuse_shared
        self.check_ids = check_ids
        self.config = config

    def route(
        self,
        router_logits: Tensor,
        correction_bias: Tensor,
        *,
        top_k: int,
        n_group: int,
        topk_group: int,
        routed_scaling_factor: float,
        renormalize: bool = True,
    ) -> tuple[Tensor, Tensor]:
        """See :meth:`dsa_runtime.families.MoEKernels.route` (one fused kernel)."""
        return fused_route(
            router_logits, correction_bias, top_k=top_k, n_group=n_group, topk_group=topk_group,
            routed_scaling_factor=routed_scaling_factor, renormalize=renormalize,
        )

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
        """See :meth:`dsa_runtime.families.MoEKernels.experts`: ``[T, D]`` bf16 out; ``out_dtype`` float32
        keeps the per-pair down-projection outputs and their sum in fp32 (a TP rank's unrounded partial sum;
        twice the bytes of the per-pair buffer)."""
        out_dtype = experts_out_dtype(out_dtype)
        fmt = scale_fmt or self.scale_fmt
        if x.dim() != 2:
            raise ValueError(f"x must be [T, D], got shape {tuple(x.shape)}")
        tokens, dim = x.shape
        n_exp, two_inter, wdim = experts.w13.shape
        if wdim != dim or experts.w2.shape != (n_exp, dim, two_inter // 2):
            raise ValueError(
                f"expert shapes w13 {tuple(experts.w13.shape)}, w2 {tuple(experts.w2.shape)} do not fit x [T, {dim}]"
            )
        if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != tokens:
            raise ValueError(f"topk ids {tuple(topk_ids.shape)} / weights {tuple(topk_weights.shape)} vs {tokens} tokens")
        # Ids outside [0, E) are dropped by the alignment and skipped by the combine: never dereferenced.
        ids = topk_ids.to(device=x.device, dtype=torch.int32).contiguous()
        out = torch.empty(tokens, dim, dtype=out_dtype, device=x.device)
        if tokens == 0:
            return out
        fuse = shared is not None and self.fuse_shared and shared.is_fp8 == experts.is_fp8
        extra = None
        if shared is not None and not fuse:
            zeros = torch.zeros(tokens, 1, dtype=torch.int32, device=x.device)
            ones = torch.ones(tokens, 1, dtype=torch.float32, device=x.device)
            extra = self._grouped(x, ones, zeros, shared, None, fmt, out=None, out_dtype=out_dtype)
        out = self._grouped(x, topk_weights, ids, experts, shared if fuse else None, fmt, out=out, extra=extra,
                            out_dtype=out_dtype)
        # Checked after every launch is queued: the one host sync then waits on finished work instead of
        # leaving the GPU idle while the rest is launched (bad ids were already skipped like -1).
        capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
        if self.check_ids and not capturing and bool(((ids < -1) | (ids >= n_exp)).any()):
            raise ValueError(f"expert ids must be -1 or in [0, {n_exp})")
        return out

    def _grouped(
        self, x: Tensor, topk_weights: Tensor, ids: Tensor, experts: ExpertWeights, shared: ExpertWeights | None,
        fmt: str, *, out: Tensor | None, extra: Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
    ) -> Tensor:
        """One grouped pass over ``experts`` (+ ``shared`` as expert ``E``); returns ``[T, D]`` ``out_dtype``
        (the per-pair buffer in that dtype too; the kernels store in their output pointers' dtype)."""
        tokens, dim = x.shape
        top_k = ids.shape[1]
        n_exp, two_inter, _ = experts.w13.shape
        inter = two_inter // 2
        fp8 = experts.is_fp8
        n_addr = n_exp + (shared is not None)
        pairs = tokens * top_k + (tokens if shared is not None else 0)
        used = min(pairs, n_addr)
        cfg = self.config or default_config(pairs / max(used, 1), fp8)
        if fp8 and cfg.block_k != 128:
            raise ValueError("FP8 experts need block_k == 128 (one weight scale block per K step)")
        quant_h = fp8 and cfg.block_n_up == 128  # else h goes out in bf16 and is quantized apart
        if small_align_fits(pairs, n_addr) and (x.is_cuda or INTERPRET):
            blocks = align_pairs_small(ids, n_exp, cfg.block_m, shared=shared is not None)
        else:
            expert_of_pair = ids.reshape(-1)
            expert_of_pair = torch.where((expert_of_pair >= 0) & (expert_of_pair < n_exp), expert_of_pair, -1)
            if shared is not None:
                expert_of_pair = torch.cat(
                    [expert_of_pair, torch.full((tokens,), n_exp, dtype=torch.int32, device=x.device)]
                )
            blocks = align_pairs(expert_of_pair, n_addr, cfg.block_m)
        rows = blocks.sorted_pairs.shape[0]
        w13 = experts.w13.contiguous()
        w2 = experts.w2.contiguous()
        sw13, sw2 = (shared.w13.contiguous(), shared.w2.contiguous()) if shared is not None else (w13, w2)
        if fp8:
            a, a_scale = quantize_rows(x.contiguous(), fmt)
            s13 = experts.w13_scale.float().contiguous()
            s2 = experts.w2_scale.float().contiguous()
            ss13, ss2 = (
                (shared.w13_scale.float().contiguous(), shared.w2_scale.float().contiguous())
                if shared is not None else (s13, s2)
            )
            h = torch.empty(rows, inter, dtype=torch.float8_e4m3fn if quant_h else torch.bfloat16, device=x.device)
            h_scale = torch.empty(rows, triton.cdiv(inter, 128), dtype=torch.float32, device=x.device)
        else:
            a = x.to(torch.bfloat16).contiguous()
            a_scale = s13 = s2 = ss13 = ss2 = h_scale = torch.empty(1, 1, dtype=torch.float32, device=x.device)
            h = torch.empty(rows, inter, dtype=torch.bfloat16, device=x.device)
        common = (blocks.sorted_pairs, blocks.block_expert, blocks.num_padded, pairs, tokens * top_k, top_k)
        n_blocks = blocks.max_blocks
        grid_up = (blocks.max_blocks * triton.cdiv(inter, cfg.block_n_up),)
        moe_gemm.gemm_up[grid_up](
            a, a_scale, w13, s13, sw13, ss13, h, h_scale, *common, dim, inter, n_exp, n_blocks,
            a.stride(0), a_scale.stride(0), w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(-2),
            h.stride(0), h_scale.stride(0),
            FP8=fp8, UE8M0=fmt == "ue8m0", HAS_SHARED=shared is not None, UPCAST=INTERPRET,
            QUANT_H=quant_h, EVEN_K=dim % cfg.block_k == 0, SPLIT_N=cfg.split_n,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n_up, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
            num_warps=cfg.warps_up, num_stages=cfg.stages_up,
        )
        if fp8 and not quant_h:
            h, h_scale = quantize_rows(h, fmt)
        y = torch.empty(pairs, dim, dtype=out_dtype, device=x.device)
        wts = topk_weights.to(device=x.device, dtype=torch.float32).contiguous()
        grid_down = (blocks.max_blocks * triton.cdiv(dim, cfg.block_n_down),)
        moe_gemm.gemm_down[grid_down](
            h, h_scale, w2, s2, sw2, ss2, y, wts, *common, inter, dim, n_exp, n_blocks,
            h.stride(0), h_scale.stride(0), w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(-2), y.stride(0),
            FP8=fp8, HAS_SHARED=shared is not None, UPCAST=INTERPRET, EVEN_K=inter % cfg.block_k == 0,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n_down, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
            num_warps=cfg.warps_down, num_stages=cfg.stages_down,
        )
        if out is None:
            out = torch.empty(tokens, dim, dtype=out_dtype, device=x.device)
        block = 1024
        moe_gemm.combine[(tokens, triton.cdiv(dim, block))](
            y, ids, out, extra if extra is not None else out, tokens, dim, n_exp, y.stride(0), out.stride(0),
            extra.stride(0) if extra is not None else 0,
            TOPK=top_k, SHARED_ROWS=shared is not None, HAS_EXTRA=extra is not None, BLOCK_N=block, num_warps=4,
        )
        return out
