"""The kernel families: names and the contract each implementation follows.

Every backend provides one object per family it supports. The methods below and those of
:mod:`dsa_runtime.families_moe` (``moe``, ``moe_comm``; imported from here) are the whole contract:
shapes, dtypes and layouts in the docstrings are normative, and the conformance kit
(:mod:`dsa_runtime.testing`) checks each claimed case against the ``reference`` backend.

Conventions used throughout:

* ``e4m3`` is ``torch.float8_e4m3fn`` (max 448). FP8 scales are fp32 multipliers: ``x ~= fp32(x8) * scale``.
* ``scale_fmt`` is ``"ue8m0"`` (scale rounded *up* to a power of two, as V3.1/V3.2 checkpoints use) or
  ``"float"`` (plain ``amax / 448``, V3/R1). In both, ``amax`` is floored at ``1e-4`` first. It is a property
  of the checkpoint's weights and activations only: the ``fp8_656`` KV cache always stores ue8m0 scales
  (FlashMLA on SM90 rounds the scale to bf16 when dequantizing, exact only for powers of two).
* Attention indices are ``-1`` (empty) or a valid row / slot; any other value is a caller error (behaviour
  undefined; the conformance kit never sends one).
* Index tensors are ``int32``; ``-1`` marks an empty slot and is never dereferenced.
* A *slot* is a physical KV position: ``page * page_size + offset``.
* MLA rows have ``d_qk = 576`` (512 latent ``c`` + 64 rotated ``k_pe``) and ``d_v = 512``.

Cache layouts (written and read by ``dsa_runtime.reference.kv_quant``, the reference implementation):

* ``"bf16"`` MLA layout: cache ``[pages, page_size, 576]`` bf16, row = ``[c | k_pe]``.
* ``"fp8_656"`` MLA layout: cache ``[pages, page_size, 656]`` uint8, row bytes 0-511 = 512 e4m3 of ``c``,
  512-527 = four fp32 scales (scale j covers ``c[128j:128j+128]``; always a power of two,
  ``2 ** ceil(log2(max(amax, 1e-4) / 448))``), 528-655 = 64 bf16 of ``k_pe``.
* ``"index_k_132"`` indexer layout: cache ``[pages, page_size * 132]`` uint8; one page holds
  ``page_size * 128`` e4m3 bytes (token-major) followed by ``page_size`` fp32 scales.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

# The MoE families (moe, moe_comm) are written in their own module; this one is their import path.
from dsa_runtime.families_moe import Dispatched as Dispatched
from dsa_runtime.families_moe import EPGroup as EPGroup
from dsa_runtime.families_moe import ExpertWeights as ExpertWeights
from dsa_runtime.families_moe import MoECommKernels as MoECommKernels
from dsa_runtime.families_moe import MoEKernels as MoEKernels
from dsa_runtime.families_moe import experts_out_dtype as experts_out_dtype

if TYPE_CHECKING:
    import torch
    from torch import Tensor

Family = Literal["indexer", "topk", "sparse_attn", "kv_quant", "moe", "moe_comm"]
FAMILIES: tuple[Family, ...] = ("indexer", "topk", "sparse_attn", "kv_quant", "moe", "moe_comm")
# The methods of each family's protocol (below): a backend claims, and the engine resolves, single methods,
# named "family.method" (e.g. "sparse_attn.prefill").
FAMILY_METHODS: dict[str, tuple[str, ...]] = {
    "indexer": ("quantize_q", "quantize_k", "logits_ragged", "logits_paged"),
    "topk": ("topk", "page_table_transform", "topk_transform"),
    "sparse_attn": ("prefill", "decode"),
    "kv_quant": ("quantize_mla", "dequantize_mla", "store_mla", "store_index_k", "gather_index_k"),
    "moe": ("route", "experts"),
    "moe_comm": ("dispatch", "combine"),
}
METHODS: tuple[str, ...] = tuple(f"{f}.{m}" for f in FAMILIES for m in FAMILY_METHODS[f])

ScaleFmt = Literal["ue8m0", "float"]
MLALayout = Literal["bf16", "fp8_656"]
MLA_LAYOUTS: tuple[MLALayout, ...] = ("bf16", "fp8_656")

D_LATENT = 512
D_ROPE = 64
D_QK = D_LATENT + D_ROPE  # 576
D_V = D_LATENT  # 512
FP8_MLA_ROW_BYTES = 656
INDEX_HEAD_DIM = 128
INDEX_K_ROW_BYTES = INDEX_HEAD_DIM + 4  # 132
FP8_MAX = 448.0
FP8_AMAX_FLOOR = 1e-4
QUANT_BLOCK = 128


def mla_row_format(layout: str) -> tuple[int, torch.dtype]:
    """Row width and dtype of an MLA cache ``layout``: ``bf16`` -> (576, bfloat16), ``fp8_656`` -> (656, uint8)."""
    import torch

    if layout == "fp8_656":
        return FP8_MLA_ROW_BYTES, torch.uint8
    if layout == "bf16":
        return D_QK, torch.bfloat16
    raise ValueError(f"unknown MLA layout {layout!r}; valid: bf16, fp8_656")


def check_mla_cache(kv_cache: Tensor, layout: str) -> None:
    """Raise ``ValueError`` unless ``kv_cache`` is a ``[pages, page_size, W]`` cache of ``layout``'s rows."""
    width, dtype = mla_row_format(layout)
    if kv_cache.dim() != 3 or kv_cache.shape[-1] != width or kv_cache.dtype != dtype:
        raise ValueError(f"{layout} cache must be [pages, page_size, {width}] {dtype}, got "
                         f"{tuple(kv_cache.shape)} {kv_cache.dtype}")


@runtime_checkable
class IndexerKernels(Protocol):
    """Lightning indexer: FP8 logits ``I[t, s] = k_scale[s] * sum_h w[t, h] * relu(q8[t, h] . k8[s])``."""

    def quantize_q(
        self, q: Tensor, head_weights: Tensor, *, scale_fmt: ScaleFmt = "ue8m0"
    ) -> tuple[Tensor, Tensor]:
        """Rotate and quantize indexer queries and fold their scales into the head weights.

        Args:
            q: ``[T, H, 128]`` bf16 (or fp32), RoPE already applied, *before* the Hadamard rotation.
            head_weights: ``[T, H]`` fp32, the raw ``weights_proj(x)`` output.
        Returns:
            ``q8`` ``[T, H, 128]`` e4m3: normalized Walsh-Hadamard rotation ``H x / sqrt(128)``, then one FP8
            block (scale) per (t, h); and ``w`` ``[T, H]`` fp32 =
            ``head_weights * H**-0.5 * q_scale * 128**-0.5``.
        """
        ...

    def quantize_k(self, k: Tensor, *, scale_fmt: ScaleFmt = "ue8m0") -> tuple[Tensor, Tensor]:
        """Rotate and quantize indexer keys.

        Args:
            k: ``[S, 128]`` bf16 or fp32, after ``k_norm`` and RoPE, before the Hadamard rotation.
        Returns:
            ``k8`` ``[S, 128]`` e4m3 and ``k_scale`` ``[S]`` fp32 (one block per token).
        """
        ...

    def logits_ragged(
        self, q8: Tensor, weights: Tensor, k8: Tensor, k_scale: Tensor, ks: Tensor, ke: Tensor
    ) -> Tensor:
        """Prefill logits with a key window per query row (DeepGEMM ``fp8_mqa_logits`` semantics).

        Args:
            q8: ``[T, H, 128]`` e4m3. weights: ``[T, H]`` fp32 (from :meth:`quantize_q`).
            k8: ``[S, 128]`` e4m3 and k_scale ``[S]`` fp32: keys of all requests, concatenated.
            ks, ke: ``[T]`` int32; row t sees keys ``ks[t] <= s < ke[t]`` (an empty window is allowed).
        Returns:
            ``[T, S]`` fp32, ``-inf`` outside each row's window.
        """
        ...

    def logits_paged(
        self,
        q8: Tensor,
        weights: Tensor,
        index_cache: Tensor,
        context_lens: Tensor,
        block_table: Tensor,
        max_context_len: int,
    ) -> Tensor:
        """Decode logits over the paged ``index_k_132`` cache (DeepGEMM ``fp8_paged_mqa_logits``).

        Args:
            q8: ``[B, N, H, 128]`` e4m3, N = queries per request (1, or 2+ with MTP).
            weights: ``[B * N, H]`` fp32.
            index_cache: ``[pages, page_size * 132]`` uint8; page_size = ``index_cache.shape[1] // 132``.
            context_lens: ``[B]`` int32, tokens in each request's cache (the N new ones included).
            block_table: ``[B, max_pages]`` int32, request page -> physical page.
            max_context_len: width of the output.
        Returns:
            ``[B * N, max_context_len]`` fp32. Query j of request b sees positions
            ``p < context_lens[b] - N + j + 1``; every other entry is ``-inf``.
        """
        ...


@runtime_checkable
class TopKKernels(Protocol):
    """Exact top-k within each row's window, and the request-position -> KV-slot transform."""

    def topk(self, logits: Tensor, row_starts: Tensor, row_ends: Tensor, k: int) -> Tensor:
        """Select the k largest logits of each row inside ``[row_starts[r], row_ends[r])``.

        Args:
            logits: ``[R, L]`` fp32 (values outside the window are ignored, whatever they are).
            row_starts, row_ends: ``[R]`` int32 with ``0 <= start <= end <= L``.
            k: number of entries per row (2048 for V3.2; any positive k is allowed).
        Returns:
            ``[R, k]`` int32 positions *relative to the row start* (``col - row_starts[r]``). When the window
            holds ``n < k`` keys every one of them is selected and the other ``k - n`` entries are ``-1``.
            Order inside a row is unspecified; the kit judges the selected set. Every position inside the
            window is a candidate, ``-inf`` logits included; a NaN logit ranks as ``-inf``. Ties: the reference
            keeps the lower column; other backends may break ties differently (the kit accepts any set with the
            same values).
        """
        ...

    def page_table_transform(
        self, topk_indices: Tensor, page_table: Tensor, row_to_batch: Tensor, page_size: int
    ) -> Tensor:
        """Map request positions to physical slots: ``page_table[b, p // page_size] * page_size + p % page_size``.

        Args:
            topk_indices: ``[R, k]`` int32 request positions, ``-1`` padded.
            page_table: ``[B, max_pages]`` int32. row_to_batch: ``[R]`` int32, the request of each row.
        Returns:
            ``[R, k]`` int32 slots; ``-1`` stays ``-1``.
        """
        ...

    def topk_transform(
        self,
        logits: Tensor,
        row_starts: Tensor,
        row_ends: Tensor,
        k: int,
        page_table: Tensor,
        row_to_batch: Tensor,
        page_size: int,
    ) -> Tensor:
        """Fused :meth:`topk` then :meth:`page_table_transform`; same result as calling both."""
        ...


@runtime_checkable
class SparseAttnKernels(Protocol):
    """Sparse MLA in absorbed (MQA) form over top-k selected latents; returns output and log-sum-exp.

    ``score = (q . kv_row[:576]) * sm_scale`` over the selected rows; ``out = softmax(score) @ kv_row[:512]``;
    ``lse = log(sum(exp(score)))`` in natural log. A query whose selection holds no valid row outputs zeros
    and ``lse = +inf`` (FlashMLA's convention). Duplicate indices each contribute (top-k never makes them).
    Accumulate in fp32. ``sm_scale`` for V3.2 is 0.135234 (never 576**-0.5).
    """

    def prefill(
        self, q: Tensor, kv: Tensor, indices: Tensor, sm_scale: float, d_v: int = D_V
    ) -> tuple[Tensor, Tensor]:
        """Ragged prefill over a flat bf16 KV buffer (``flash_mla_sparse_fwd`` semantics).

        Args:
            q: ``[T, H, 576]`` bf16, any head count H.
            kv: ``[S, 576]`` bf16 (batches flattened; indices already offset).
            indices: ``[T, K]`` int32 rows of ``kv``: each ``-1`` (empty) or ``0 <= i < S``; anything else is a
                caller error.
        Returns:
            ``out`` ``[T, H, d_v]`` bf16 and ``lse`` ``[T, H]`` fp32.
        """
        ...

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
        """Paged decode (``flash_mla_with_kvcache(..., indices=...)`` semantics).

        Args:
            q: ``[B, Q, H, 576]`` bf16 (Q queries per request, e.g. 2 with MTP).
            kv_cache: ``[pages, page_size, 576]`` bf16 (``layout="bf16"``) or ``[pages, page_size, 656]`` uint8
                (``layout="fp8_656"``).
            indices: ``[B, Q, K]`` int32 physical slots: each ``-1`` (empty) or ``0 <= slot < pages *
                page_size``; anything else is a caller error.
        Returns:
            ``out`` ``[B, Q, H, d_v]`` bf16 and ``lse`` ``[B, Q, H]`` fp32.
        """
        ...


@runtime_checkable
class KVQuantKernels(Protocol):
    """KV cache layouts: quantize, store into pages, dequantize."""

    def quantize_mla(self, c: Tensor, k_pe: Tensor, *, layout: MLALayout) -> Tensor:
        """Pack MLA rows. c: ``[N, 512]``, k_pe: ``[N, 64]`` (bf16, k_pe already rotated).

        Returns ``[N, 656]`` uint8 for ``fp8_656`` (c quantized per 128-tile with power-of-two (ue8m0)
        scales, whatever the checkpoint's ``scale_fmt``; k_pe kept bf16) or ``[N, 576]`` bf16 for ``bf16``.
        """
        ...

    def dequantize_mla(self, rows: Tensor, *, layout: MLALayout) -> Tensor:
        """Unpack ``[N, 656]`` uint8 or ``[N, 576]`` bf16 rows into ``[N, 576]`` bf16."""
        ...

    def store_mla(
        self,
        kv_cache: Tensor,
        slots: Tensor,
        c: Tensor,
        k_pe: Tensor,
        *,
        layout: MLALayout,
    ) -> None:
        """Quantize (as :meth:`quantize_mla`) and write rows into ``kv_cache`` ``[pages, page_size, W]`` in place.

        slots: ``[N]`` int32/int64; a slot of ``-1`` is skipped (padding). Other slots are untouched.
        """
        ...

    def store_index_k(self, index_cache: Tensor, slots: Tensor, k8: Tensor, k_scale: Tensor) -> None:
        """Write ``k8`` ``[N, 128]`` e4m3 and ``k_scale`` ``[N]`` fp32 into the ``index_k_132`` cache in place.

        ``index_cache`` ``[pages, page_size * 132]`` uint8; slot ``-1`` is skipped.
        """
        ...

    def gather_index_k(self, index_cache: Tensor, slots: Tensor) -> tuple[Tensor, Tensor]:
        """Read ``[N]`` slots back: ``k8`` ``[N, 128]`` e4m3 and ``k_scale`` ``[N]`` fp32."""
        ...


FAMILY_PROTOCOLS: dict[str, type] = {
    "indexer": IndexerKernels,
    "topk": TopKKernels,
    "sparse_attn": SparseAttnKernels,
    "kv_quant": KVQuantKernels,
    "moe": MoEKernels,
    "moe_comm": MoECommKernels,
}
