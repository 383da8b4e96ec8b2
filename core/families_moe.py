"""The MoE kernel families: ``moe`` (routing and the SwiGLU experts) and ``moe_comm`` (expert-parallel dispatch and
combine), with the types their methods take. Part of the contract in :mod:`dsa_runtime.families`, which
re-exports every name here (import them from there); conventions and layouts are stated in that module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from torch import Tensor


def experts_out_dtype(out_dtype: torch.dtype | None) -> torch.dtype:
    """The dtype :meth:`MoEKernels.experts` returns for its ``out_dtype`` argument (None: bfloat16);
    ``ValueError`` for any other than bfloat16 and float32."""
    import torch

    got = out_dtype or torch.bfloat16
    if got not in (torch.bfloat16, torch.float32):
        raise ValueError(f"out_dtype must be bfloat16 or float32, got {out_dtype}")
    return got


@dataclass
class ExpertWeights:
    """Stacked SwiGLU expert weights: ``out = w2 @ (silu(w1 @ x) * (w3 @ x))``.

    w13: ``[E, 2 * I, D]``, rows ``[:I]`` = w1 (gate_proj), rows ``[I:]`` = w3 (up_proj).
    w2: ``[E, D, I]`` (down_proj). Either bf16, or e4m3 with block scales
    ``w13_scale`` ``[E, ceil(2I / 128), ceil(D / 128)]`` and ``w2_scale`` ``[E, ceil(D / 128), ceil(I / 128)]``
    fp32 (multipliers; edge blocks may be partial).
    """

    w13: Tensor
    w2: Tensor
    w13_scale: Tensor | None = None
    w2_scale: Tensor | None = None

    @property
    def is_fp8(self) -> bool:
        return self.w13_scale is not None


@runtime_checkable
class MoEKernels(Protocol):
    """DeepSeek MoE: grouped top-k routing and the expert computation."""

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
        """Grouped ``noaux_tc`` routing.

        Args:
            router_logits: ``[T, E]`` fp32 (``x @ Wg.T`` in fp32).
            correction_bias: ``[E]`` fp32, used for *choosing* only.
        Returns:
            ``weights`` ``[T, top_k]`` fp32 and ``ids`` ``[T, top_k]`` int32. ``p = sigmoid(logits)``;
            ``b = p + bias`` viewed as ``n_group`` groups; group score = sum of the top-2 ``b`` in the group;
            keep ``topk_group`` groups; choose top_k experts by ``b`` inside them; weights are the *unbiased*
            ``p`` of the chosen experts, divided by their sum when ``renormalize``, times
            ``routed_scaling_factor``. Order of the k entries is unspecified. Ties: lower index wins.
            When ``renormalize`` and the chosen ``p`` sum to 0 (every sigmoid underflowed), the weights are 0.
        """
        ...

    def experts(
        self,
        x: Tensor,
        topk_weights: Tensor,
        topk_ids: Tensor,
        experts: ExpertWeights,
        shared: ExpertWeights | None = None,
        *,
        out_dtype: torch.dtype | None = None,
    ) -> Tensor:
        """``out[t] = sum_j topk_weights[t, j] * E_{ids[t, j]}(x[t]) + shared(x[t])``.

        Args:
            x: ``[T, D]`` bf16. topk_weights: ``[T, k]`` fp32. topk_ids: ``[T, k]`` int32, ``-1`` = skip
                (an expert held by another rank).
            experts: ``E`` routed experts. shared: one expert (``E = 1``) always added with weight 1, or None.
            out_dtype: ``torch.bfloat16`` (None means bfloat16), or ``torch.float32`` for the fp32 sum without
                its final rounding (a tensor-parallel rank's partial sum, rounded once after the all-reduce).
        Returns:
            ``[T, D]`` in ``out_dtype`` (accumulated in fp32).
        """
        ...


@dataclass
class EPGroup:
    """One rank's expert-parallel group: ``size`` ranks, this one at ``rank``, each holding ``num_experts / size``
    consecutive routed experts (rank q: global ids ``[q * n, (q + 1) * n)``). ``group``: the
    ``torch.distributed`` process group of the EP ranks (None when ``size`` is 1)."""

    rank: int
    size: int
    num_experts: int
    group: Any = None

    @property
    def experts_per_rank(self) -> int:
        return self.num_experts // self.size


@dataclass
class Dispatched:
    """The rows a rank's experts run on, as :meth:`MoECommKernels.dispatch` returns them.

    Attributes:
        x: ``[R, D]`` hidden rows in the input's dtype, one per (source token, this rank) pair: a source
            token appears once on every rank holding at least one of its experts. Backends may add padding
            rows (fixed-capacity buffers); their ``topk_ids`` are all ``-1``.
        topk_ids: ``[R, k]`` int32 *local* expert ids (``global - rank * experts_per_rank``); ``-1`` where the
            token's expert lives on another rank, or the row is padding.
        topk_weights: ``[R, k]`` fp32, the routing weights of those ids (0 where the id is ``-1``).
        src_rank, src_row: ``[R]`` int64, the source EP rank and its token row; ``-1`` on padding rows.
        handle: backend-private, what :meth:`MoECommKernels.combine` needs to send rows back.
    """

    x: Tensor
    topk_ids: Tensor
    topk_weights: Tensor
    src_rank: Tensor
    src_row: Tensor
    handle: Any = None


@runtime_checkable
class MoECommKernels(Protocol):
    """Expert-parallel all-to-all: send each token to the ranks holding its experts, and the experts' outputs back.

    Every rank of the EP group calls each method with the same ``T`` (the engine pads the ranks' rows to one
    count) in the same order; the calls are collective over ``ep.group``.
    """

    def dispatch(self, hidden: Tensor, topk_ids: Tensor, topk_weights: Tensor, ep: EPGroup) -> Dispatched:
        """Route this rank's tokens to their experts' ranks.

        Args:
            hidden: ``[T, D]`` bf16 or fp32, this rank's tokens.
            topk_ids: ``[T, k]`` int32 *global* expert ids in ``[0, ep.num_experts)``, ``-1`` = no expert (a
                padded row whose ids are all ``-1`` is sent nowhere).
            topk_weights: ``[T, k]`` fp32.
        Returns:
            :class:`Dispatched`: the rows every rank sent here, with local ids (order unspecified).
        """
        ...

    def combine(self, expert_out: Tensor, dispatched: Dispatched, ep: EPGroup) -> Tensor:
        """Send expert outputs back and sum them per source token.

        Args:
            expert_out: ``[R, D]`` (R = ``dispatched.x.shape[0]``) fp32 or the model dtype: each row's weighted
                sum over its local experts. Padding rows (``src_rank`` -1) are ignored whatever they hold.
            dispatched: what :meth:`dispatch` returned on this rank.
        Returns:
            ``[T, D]`` in ``expert_out``'s dtype: ``out[t] = sum`` of the rows of token t over the ranks (zero
            for a token sent nowhere).
        """
        ...
