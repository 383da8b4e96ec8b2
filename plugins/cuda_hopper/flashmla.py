"""FlashMLA adapters for Hopper: ``flashmla_sparse`` (sparse prefill) and ``flashmla_kv`` (FP8 sparse decode).

FlashMLA (deepseek-ai/FlashMLA) has no usable PyPI release; a user builds it from source
(``tools/gpu/build_flashmla.sh``, commit 9241ae3: FlashMLA's 2026-09-30 release dropped Hopper). The adapters
only translate layouts and call the library; they claim exactly the shapes FlashMLA runs on SM90, because an
unclaimed shape can crash the process (prefill with k = 64 asserts, then segfaults). Narrower callers (the
tiny presets' 4 heads, 16 heads per rank under TP 8, k 32) reach them through the core's head and k padding
(:mod:`dsa_runtime.padding`).

Layouts (ours -> FlashMLA's):

* prefill: q ``[T, H, 576]`` as is (``[s_q, h_q, d_qk]``); kv ``[S, 576]`` -> ``[S, 1, 576]``; indices
  ``[T, K]`` -> ``[T, 1, K]``; returns ``(out [T, H, 512], max_logits, lse [T, H])``.
* decode: q ``[B, Q, H, 576]`` as is; cache ``[pages, 64, 656]`` uint8 -> ``[pages, 64, 1, 656]`` (a view);
  indices ``[B, Q, K]`` physical slots as is; returns ``out [B, Q, H, 512]`` and lse ``[B, H, Q]``, which
  is transposed back to our ``[B, Q, H]``.

Two API generations are handled (told apart with :func:`inspect.signature`, never by version strings):

* since FlashMLA PR #150 (2026-01-16, so at 9241ae3): ``get_mla_metadata()`` takes no arguments and the
  scheduling is computed in the first ``flash_mla_with_kvcache`` call; ``flash_mla_sparse_fwd`` has
  ``attn_sink`` / ``topk_length`` and returns a *natural-log* lse (checked through our kit on an H200);
* before it (the V3.2 release, 2025-09-29): ``get_mla_metadata(cache_seqlens, s_q * h_q, 1, h_q, True, topk)``
  returns the scheduling tensors, and the prefill lse is *base 2* ("2-based log-sum-exp" in its docstring):
  the adapter multiplies it by ln 2 and turns a ``-inf`` (empty query) into our ``+inf``.

No host synchronisation and no data-dependent allocation: decode can be captured in a CUDA graph.
"""

from __future__ import annotations

import glob
import importlib.util
import inspect
import math
import os
import sys
from typing import TYPE_CHECKING, Any

from dsa_runtime.capabilities import MethodClaim, ValueSet

if TYPE_CHECKING:
    from torch import Tensor

HEADS = ValueSet.one_of(64, 128)
PREFILL_CLAIMS: dict[str, MethodClaim] = {
    # SM90 prefill: B_H 64 tiles of heads (64 or 128 dispatched), topk % (2 * B_TOPK = 128) asserted.
    "sparse_attn.prefill": MethodClaim(
        kv_layouts=ValueSet.one_of("bf16"), heads=HEADS, k=ValueSet.multiples(128, 128, 16384)
    ),
}
DECODE_CLAIMS: dict[str, MethodClaim] = {
    # SM90 sparse decode needs the FP8 656-byte cache ("Sparse BF16 MLA is not supported"); h_q 64 or 128.
    "sparse_attn.decode": MethodClaim(
        kv_layouts=ValueSet.one_of("fp8_656"), heads=HEADS, k=ValueSet.multiples(64, 64, 16384),
        page_sizes=ValueSet.one_of(64), decode_queries=ValueSet.one_of(1, 2),
    ),
}
BUILD_HINT = "build it from source: tools/gpu/build_flashmla.sh (docs/hopper.md)"
LN2 = math.log(2.0)


def flashmla_library() -> tuple[bool, str]:
    """Whether a built ``flash_mla`` can be imported, checked without importing it (or torch).

    An already imported ``flash_mla`` counts as built. Otherwise the package must be findable and hold its
    compiled extension ``flash_mla/cuda*.so`` (a source checkout on PYTHONPATH without a build does not).
    """
    if sys.modules.get("flash_mla") is not None:
        return True, "flash_mla imported"
    try:
        spec = importlib.util.find_spec("flash_mla")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return False, f"flash_mla is not installed ({BUILD_HINT})"
    places = list(spec.submodule_search_locations or [])
    if places and not any(glob.glob(os.path.join(p, "cuda*.so")) for p in places):
        return False, f"flash_mla found at {places[0]} but not built (no cuda*.so; {BUILD_HINT})"
    return True, f"flash_mla found at {places[0] if places else spec.origin}"


def flashmla_available() -> tuple[bool, str]:
    """A built ``flash_mla`` and an SM90 GPU (NVML probe): FlashMLA's SM90 kernels run only on sm_90a."""
    from dsa_runtime.plugins.cuda_hopper import on_sm90

    return on_sm90(flashmla_library())


def _api() -> tuple[Any, bool]:
    """The imported ``flash_mla`` module and whether it has the lazy-scheduling API (PR #150 and later)."""
    import flash_mla

    params = inspect.signature(flash_mla.get_mla_metadata).parameters
    lazy = "cache_seqlens" not in params
    return flash_mla, lazy


def _legacy_args(params) -> dict[str, bool]:
    """SGLang's build (``sgl-flash-mla``) keeps the SM90 kernels that upstream dropped behind ``use_legacy``; its
    default runs the newer kernels, which SM90 cannot."""
    return {"use_legacy": True} if "use_legacy" in params else {}


class FlashMLASparse:
    """``sparse_attn.prefill`` through ``flash_mla_sparse_fwd`` (bf16 flat KV, 64/128 heads, k % 128 == 0).

    Only the claimed method exists: resolution binds methods one by one from the claims, so decode comes from
    ``flashmla_kv`` or another backend (a claim without its method would be a PluginError at resolution)."""

    def __init__(self) -> None:
        self.lib, _ = _api()
        params = inspect.signature(self.lib.flash_mla_sparse_fwd).parameters
        # PR #150 added attn_sink and switched the returned lse to the natural log.
        self.base2_lse = "attn_sink" not in params
        self.extra = _legacy_args(params)

    def prefill(self, q: Tensor, kv: Tensor, indices: Tensor, sm_scale: float, d_v: int = 512):
        """q ``[T, H, 576]`` bf16, kv ``[S, 576]`` bf16, indices ``[T, K]`` int32 -> out ``[T, H, d_v]``, lse ``[T, H]``."""
        import torch

        out, _max_logits, lse = self.lib.flash_mla_sparse_fwd(
            q.contiguous(), kv.unsqueeze(1), indices.to(torch.int32).unsqueeze(1), sm_scale, d_v, **self.extra
        )
        if self.base2_lse:
            lse = torch.where(torch.isneginf(lse), math.inf, lse * LN2)
        return out, lse


class FlashMLAKV:
    """``sparse_attn.decode`` through ``flash_mla_with_kvcache(..., indices=...)`` on the ``fp8_656`` cache (the
    only method: prefill comes from ``flashmla_sparse`` or another backend)."""

    def __init__(self) -> None:
        self.lib, self.lazy = _api()
        self._meta: dict[tuple[object, ...], tuple[Any, Any]] = {}
        self.extra = _legacy_args(inspect.signature(self.lib.flash_mla_with_kvcache).parameters)

    def _schedule(self, q: Tensor, k: int) -> tuple[Any, Any]:
        """Scheduling metadata for this shape (it depends on shapes only: no topk_length is passed).

        Cached per shape, except while a CUDA graph is being captured: a metadata object first filled inside
        a capture holds values only once the graph replays, so an eager call must never reuse it.
        """
        import torch

        b, n_q, heads, _ = q.shape
        key = (b, n_q, heads, k, q.device)
        if key in self._meta:
            return self._meta[key]
        if self.lazy:
            meta = self.lib.get_mla_metadata()
        else:
            seqlens = torch.full((b,), k, dtype=torch.int32, device=q.device)
            meta = self.lib.get_mla_metadata(seqlens, n_q * heads, 1, heads, True, k)
        if q.device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
            self._meta[key] = meta
        return meta

    def decode(self, q: Tensor, kv_cache: Tensor, indices: Tensor, sm_scale: float, *, layout: str, d_v: int = 512):
        """q ``[B, Q, H, 576]`` bf16, kv_cache ``[pages, 64, 656]`` uint8, indices ``[B, Q, K]`` int32 slots.

        Returns out ``[B, Q, H, d_v]`` bf16 and lse ``[B, Q, H]`` fp32 (natural log, ``+inf`` when empty).
        """
        import torch

        if layout != "fp8_656":
            raise ValueError(f"flashmla_kv runs the fp8_656 cache only, got layout {layout!r}")
        b, n_q, heads, _ = q.shape
        cache = kv_cache.unsqueeze(2)  # [pages, 64, 1, 656]: FlashMLA's h_kv = 1 axis
        idx = indices.to(torch.int32)
        meta = self._schedule(q, idx.shape[-1])
        if self.lazy:
            out, lse = self.lib.flash_mla_with_kvcache(
                q, cache, None, None, d_v, meta[0], None,
                softmax_scale=sm_scale, causal=False, is_fp8_kvcache=True, indices=idx, **self.extra,
            )
        else:
            seqlens = torch.full((b,), idx.shape[-1], dtype=torch.int32, device=q.device)
            table = torch.zeros((b, 1), dtype=torch.int32, device=q.device)  # unused by sparse decode
            out, lse = self.lib.flash_mla_with_kvcache(
                q, cache, table, seqlens, d_v, meta[0], meta[1],
                softmax_scale=sm_scale, causal=False, is_fp8_kvcache=True, indices=idx,
            )
        if tuple(lse.shape) != (b, heads, n_q):
            raise RuntimeError(f"flash_mla returned lse of shape {tuple(lse.shape)}, expected [b, h_q, s_q] = "
                               f"{[b, heads, n_q]}")
        return out, lse.transpose(1, 2).contiguous()


def flashmla_backends() -> list:
    """The two adapter backends (always registered; unavailable with the reason when FlashMLA is not built)."""
    from dsa_runtime.backend import Backend
    from dsa_runtime.capabilities import Capabilities

    common = {"available": flashmla_available, "platform": "cuda_hopper"}
    return [
        Backend(
            name="flashmla_sparse",
            capabilities=Capabilities(
                devices=frozenset({"cuda"}), methods=PREFILL_CLAIMS,
                not_claimed={"sparse_attn.decode": "FlashMLA's decode is the flashmla_kv backend (FP8 cache only)"},
            ),
            kernels={"sparse_attn": f"{__name__}:FlashMLASparse"},
            description="FlashMLA sparse prefill (flash_mla_sparse_fwd): bf16 KV, 64/128 heads, k % 128",
            **common,  # type: ignore[arg-type]
        ),
        Backend(
            name="flashmla_kv",
            capabilities=Capabilities(
                devices=frozenset({"cuda"}), methods=DECODE_CLAIMS,
                not_claimed={"sparse_attn.prefill": "FlashMLA's sparse prefill is the flashmla_sparse backend"},
            ),
            kernels={"sparse_attn": f"{__name__}:FlashMLAKV"},
            description="FlashMLA FP8 sparse decode (flash_mla_with_kvcache): fp8_656 cache, page 64, 64/128 heads",
            **common,  # type: ignore[arg-type]
        ),
    ]
