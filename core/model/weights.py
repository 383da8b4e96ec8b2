"""Reading HF-named checkpoint tensors into the model's working form.

Policy (documented in the model docstring too):

* routed and shared experts stay FP8 (e4m3 + fp32 block scales) when the checkpoint is FP8, stacked once
  into :class:`~dsa_runtime.families.ExpertWeights` for ``kernels.moe.experts``;
* every other linear (attention, indexer ``wq_b`` / ``wk``, dense FFN) is block-dequantised once at load to
  the model dtype and run as a plain matmul (CPU has no FP8 GEMM; on GPUs these are a small share of bytes);
* norms, gate, ``weights_proj``, embeddings and ``lm_head`` are never FP8 and are kept (gate and
  ``weights_proj`` in fp32 because the reference computes them in fp32).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.families import ExpertWeights
from dsa_runtime.reference.fp8 import E4M3, block_dequant_weight

SCALE_SUFFIX = "_scale_inv"


class WeightSource:
    """A dict of HF-named tensors with typed accessors; missing names raise ``KeyError`` naming the tensor."""

    def __init__(self, tensors: dict[str, Tensor], device: torch.device, dtype: torch.dtype, *,
                 release: bool = False) -> None:
        """``release``: a tensor leaves ``tensors`` when it is read, so its source copy is freed as soon as its
        built form (dequantised, stacked, moved) exists: building then peaks at the model plus one layer's
        sources instead of twice the model (random full-size weights drawn on the GPU need this)."""
        self.tensors = tensors
        self.device = device
        self.dtype = dtype
        self.release = release
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.tensors

    def raw(self, name: str) -> Tensor:
        try:
            t = self.tensors.pop(name) if self.release else self.tensors[name]
        except KeyError:
            raise KeyError(f"checkpoint tensor {name!r} is missing") from None
        self.used.add(name)
        return t

    def plain(self, name: str, dtype: torch.dtype | None = None) -> Tensor:
        """A non-quantised tensor (norm, gate, embedding) cast to ``dtype`` (default: model dtype)."""
        return self.raw(name).to(device=self.device, dtype=dtype or self.dtype)

    def norm(self, name: str) -> Tensor:
        """An RMSNorm weight: its model-dtype values held in fp32, the dtype the norm multiplies in (a step
        then casts each norm's weight once at load, not once per call)."""
        return self.plain(name).float()

    def linear(self, prefix: str, dtype: torch.dtype | None = None) -> Tensor:
        """``prefix.weight`` ``[out, in]`` dequantised (if FP8) to ``dtype`` (default: model dtype)."""
        w = self.raw(f"{prefix}.weight")
        scale_name = f"{prefix}.weight{SCALE_SUFFIX}"
        if w.dtype == E4M3:
            w = block_dequant_weight(w.to(self.device), self.raw(scale_name).to(self.device))
        elif scale_name in self.tensors:
            raise ValueError(f"{prefix}.weight is {w.dtype} but has a {SCALE_SUFFIX} tensor")
        return w.to(device=self.device, dtype=dtype or self.dtype)

    def _fp8_pair(self, prefix: str) -> tuple[Tensor, Tensor | None]:
        w = self.raw(f"{prefix}.weight").to(self.device)
        if w.dtype == E4M3:
            return w, self.raw(f"{prefix}.weight{SCALE_SUFFIX}").to(self.device, torch.float32)
        return w, None

    def experts(self, prefixes: list[str]) -> ExpertWeights:
        """Stack SwiGLU experts ``prefix.{gate,up,down}_proj`` into one :class:`ExpertWeights`.

        FP8 stays FP8 when the gate/up block rows line up (``intermediate % 128 == 0``, true for every
        DeepSeek checkpoint); otherwise the experts are dequantised to the model dtype.
        """
        gates = [self._fp8_pair(f"{p}.gate_proj") for p in prefixes]
        ups = [self._fp8_pair(f"{p}.up_proj") for p in prefixes]
        downs = [self._fp8_pair(f"{p}.down_proj") for p in prefixes]
        inter = gates[0][0].shape[0]
        fp8 = all(pair[1] is not None for pair in (*gates, *ups, *downs))
        if fp8 and inter % 128 == 0:
            return ExpertWeights(
                w13=torch.stack([torch.cat([g[0], u[0]], dim=0) for g, u in zip(gates, ups, strict=True)]),
                w2=torch.stack([d[0] for d in downs]),
                w13_scale=torch.stack([torch.cat([g[1], u[1]], dim=0) for g, u in zip(gates, ups, strict=True)]),
                w2_scale=torch.stack([d[1] for d in downs]),
            )

        def deq(pair: tuple[Tensor, Tensor | None]) -> Tensor:
            w, s = pair
            return (block_dequant_weight(w, s) if s is not None else w).to(self.dtype)

        return ExpertWeights(
            w13=torch.stack([torch.cat([deq(g), deq(u)], dim=0) for g, u in zip(gates, ups, strict=True)]),
            w2=torch.stack([deq(d) for d in downs]),
        )
