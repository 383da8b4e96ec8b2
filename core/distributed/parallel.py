"""The parallel layout: ``tp`` ranks in all, ``dp`` attention groups of ``tp // dp`` ranks when DP attention is on,
and ``ep`` ranks per expert-parallel group.

Rank ``r`` is in attention group ``r // attn_size`` at attention rank ``r % attn_size``. Attention heads and
the vocabulary are split over the attention group; the dense FFN intermediate dimension over all ``tp`` ranks.
Without DP attention there is one attention group of all ``tp`` ranks (pure TP).

Routed experts: with ``ep`` 1 each expert's intermediate dimension is split over all ``tp`` ranks (as the
dense FFN). With ``ep`` > 1 rank ``r`` is in EP group ``r // ep`` at EP rank ``r % ep`` and holds experts
``[ep_rank * E / ep, (ep_rank + 1) * E / ep)`` whole; tokens travel to their experts' ranks inside the EP
group (``moe_comm`` dispatch / combine) and the shared expert is replicated. ``tp // ep`` EP groups each hold
the whole expert set (``ep == tp``: one group, every rank a distinct slice of the experts).
"""

from __future__ import annotations

from dataclasses import dataclass

REDUCE_DTYPES = ("fp32", "bf16")


@dataclass(frozen=True)
class ParallelConfig:
    """``--tp``, ``--dp``, ``--enable-dp-attention`` and the multi-node flags (SGLang's names).

    Attributes:
        tp: ranks in all (tensor-parallel size of the FFN / MoE).
        dp: attention data-parallel groups; > 1 only with ``enable_dp_attention``.
        enable_dp_attention: split the ranks into ``dp`` attention groups, each with its own requests and KV
            cache; tokens of all groups meet in the FFN / MoE.
        nnodes, node_rank: nodes in all and this node's index; each node runs ``tp // nnodes`` ranks.
        dist_init_addr: ``host:port`` of node 0's rendezvous (default ``127.0.0.1:<free port>`` on one node).
        timeout_s: collective timeout; a stuck or dead peer becomes an error after this long, never a hang.
        reduce_dtype: ``fp32`` (default): row-parallel layers (``o_proj``, FFN / MoE down projections) return
            fp32 partial sums, all-reduced in fp32 and rounded to the model dtype once, so tp N differs from
            tp 1 only by fp32 summation order; ``bf16``: partials rounded and reduced in the model dtype (half
            the all-reduce bytes, what SGLang / vLLM do; tp N then drifts from tp 1 by bf16 roundings).
        ep: ``--ep-size``: ranks per expert-parallel group (1: experts TP-split over every rank); divides ``tp``.
    """

    tp: int = 1
    dp: int = 1
    enable_dp_attention: bool = False
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    timeout_s: float = 120.0
    reduce_dtype: str = "fp32"
    ep: int = 1

    def __post_init__(self) -> None:
        if self.tp < 1 or self.dp < 1:
            raise ValueError(f"--tp and --dp must be >= 1, got tp {self.tp}, dp {self.dp}")
        if self.dp > 1 and not self.enable_dp_attention:
            raise ValueError("--dp > 1 needs --enable-dp-attention (data-parallel attention groups)")
        if self.tp % self.dp:
            raise ValueError(f"--tp {self.tp} must be a multiple of --dp {self.dp}")
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank {self.node_rank} must be in [0, --nnodes {self.nnodes})")
        if self.tp % self.nnodes:
            raise ValueError(f"--tp {self.tp} must be a multiple of --nnodes {self.nnodes}")
        if self.nnodes > 1 and not self.dist_init_addr:
            raise ValueError("multi-node runs need --dist-init-addr HOST:PORT (node 0's address)")
        if self.timeout_s <= 0:
            raise ValueError("the collective timeout must be > 0")
        if self.ep < 1 or self.tp % self.ep:
            raise ValueError(f"--ep-size {self.ep} must divide the world size (--tp {self.tp})")
        if self.reduce_dtype not in REDUCE_DTYPES:
            raise ValueError(f"--tp-reduce-dtype must be one of {', '.join(REDUCE_DTYPES)}, got {self.reduce_dtype!r}")

    @property
    def attn_size(self) -> int:
        """Ranks per attention group (heads and vocabulary are split over these)."""
        return self.tp // self.dp

    @property
    def ranks_per_node(self) -> int:
        return self.tp // self.nnodes

    @property
    def enabled(self) -> bool:
        return self.tp > 1

    def rank_info(self, rank: int) -> RankInfo:
        if not 0 <= rank < self.tp:
            raise ValueError(f"rank {rank} outside [0, {self.tp})")
        return RankInfo(rank=rank, world=self.tp, attn_size=self.attn_size, dp=self.dp, ep=self.ep)

    def check_model(self, num_heads: int, intermediate: int, moe_intermediate: int | None,
                    n_routed_experts: int = 0) -> None:
        """One clear error when the model's dimensions do not split over this layout."""
        if num_heads % self.attn_size:
            raise ValueError(f"{num_heads} attention heads do not split over {self.attn_size} ranks per attention group")
        if self.ep > 1 and (not n_routed_experts or n_routed_experts % self.ep):
            raise ValueError(f"--ep-size {self.ep} does not divide the model's {n_routed_experts} routed experts")
        # Under EP the experts stay whole: only the dense FFN's intermediate dimension is split.
        split = [("intermediate_size", intermediate)] + ([("moe_intermediate_size", moe_intermediate)]
                                                         if self.ep == 1 else [])
        for what, n in split:
            if n is not None and n % self.tp:
                raise ValueError(f"{what} {n} does not split over --tp {self.tp}")


@dataclass(frozen=True)
class RankInfo:
    """One rank's place: world rank, attention group (``dp_rank``) and rank inside it (``attn_rank``), and its
    rank inside its expert-parallel group (``ep_rank``, of ``ep``)."""

    rank: int
    world: int
    attn_size: int
    dp: int
    ep: int = 1

    @property
    def ep_rank(self) -> int:
        return self.rank % self.ep

    @property
    def ep_ranks(self) -> list[int]:
        """World ranks of this rank's EP group (consecutive)."""
        start = self.rank - self.ep_rank
        return list(range(start, start + self.ep))

    def expert_range(self, n_experts: int) -> tuple[int, int]:
        """Routed experts ``[start, end)`` this rank holds whole (all of them when ``ep`` is 1)."""
        per = n_experts // self.ep
        return self.ep_rank * per, (self.ep_rank + 1) * per

    @property
    def dp_rank(self) -> int:
        return self.rank // self.attn_size

    @property
    def attn_rank(self) -> int:
        return self.rank % self.attn_size

    @property
    def attn_ranks(self) -> list[int]:
        """World ranks of this rank's attention group."""
        start = self.dp_rank * self.attn_size
        return list(range(start, start + self.attn_size))
