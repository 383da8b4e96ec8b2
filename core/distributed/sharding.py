"""How every weight is split across ranks: the one table the loaders and the model read.

=====================================================  =======  =====  =========================================
tensor (HF name, main stack)                           dim      over   why
=====================================================  =======  =====  =========================================
self_attn.q_b_proj / q_proj .weight [H*(nope+rope), *]  0 rows  attn   query heads split (column-parallel)
self_attn.kv_b_proj.weight [H*(nope+v), kv_lora]       0 rows  attn   per-head W_UK / W_UV split with the heads
self_attn.o_proj.weight [D, H*v]                       1 cols  attn   row-parallel; partial sums all-reduced
self_attn.q_a_proj, q_a_layernorm, kv_a_proj_with_mqa,  -       -      replicated: every rank writes the same
  kv_a_layernorm, indexer.*                                            KV latent and computes the same top-k
mlp.{gate,up}_proj (dense, experts.J, shared_experts)  0 rows  world  intermediate split (column-parallel)
mlp.*down_proj [D, I]                                  1 cols  world  row-parallel; partial sums all-reduced
mlp.gate.weight, mlp.gate.e_score_correction_bias      -       -      replicated: every rank routes the same
model.embed_tokens.weight, lm_head.weight [V, D]       0 rows  attn   vocab-parallel (ceil(V / n) rows each)
norms                                                  -       -      replicated
=====================================================  =======  =====  =========================================

``attn`` = the rank's attention group (all ranks without DP attention), ``world`` = every rank. Under expert
parallelism (``RankInfo.ep`` > 1) the routed experts leave this table: a rank reads only its experts
(``RankInfo.expert_range``), each whole, FP8 with its scales as stored, and the shared expert is replicated. The MTP
layer is not run under TP and not loaded. FP8 weights are sliced with their ``weight_scale_inv`` block
scales when the slice starts and ends on 128-row/column block edges (they stay FP8); otherwise the slice is
dequantised to bf16 on load (the scales of a partial block cannot be split).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dsa_runtime.distributed.parallel import RankInfo

if TYPE_CHECKING:
    from torch import Tensor

BLOCK = 128
SCALE_SUFFIX = "_scale_inv"


@dataclass(frozen=True)
class ShardRule:
    """Split dimension ``dim`` of a tensor into equal (ceil) parts over ``group`` (``"attn"`` or ``"world"``)."""

    dim: int
    group: str


_RULES: list[tuple[re.Pattern[str], ShardRule | None]] = [
    (re.compile(r"\.self_attn\.(q_b_proj|q_proj|kv_b_proj)\.weight$"), ShardRule(0, "attn")),
    (re.compile(r"\.self_attn\.o_proj\.weight$"), ShardRule(1, "attn")),
    (re.compile(r"\.mlp\.(experts\.\d+\.|shared_experts\.)?(gate_proj|up_proj)\.weight$"), ShardRule(0, "world")),
    (re.compile(r"\.mlp\.(experts\.\d+\.|shared_experts\.)?down_proj\.weight$"), ShardRule(1, "world")),
    (re.compile(r"^(model\.embed_tokens|lm_head)\.weight$"), ShardRule(0, "attn")),
]


_EXPERT = re.compile(r"\.mlp\.experts\.(\d+)\.")
_SHARED = re.compile(r"\.mlp\.shared_experts\.")


def expert_index(name: str) -> int | None:
    """The routed expert a tensor belongs to (``...mlp.experts.J....``), or None."""
    m = _EXPERT.search(name)
    return int(m.group(1)) if m else None


def shard_rule(name: str) -> ShardRule | None:
    """How tensor ``name`` is split, or None when every rank holds all of it (scale tensors follow their
    weight and are not listed)."""
    for pattern, rule in _RULES:
        if pattern.search(name):
            return rule
    return None


def part_range(n: int, parts: int, index: int) -> tuple[int, int]:
    """Rows ``[start, end)`` of part ``index`` when ``n`` is cut in ``parts`` pieces of ``ceil(n / parts)``."""
    size = -(-n // parts)
    start = min(index * size, n)
    return start, min(start + size, n)


def rank_range(rule: ShardRule, n: int, info: RankInfo) -> tuple[int, int]:
    if rule.group == "attn":
        return part_range(n, info.attn_size, info.attn_rank)
    return part_range(n, info.world, info.rank)


def is_mtp(name: str, num_hidden_layers: int) -> bool:
    m = re.match(r"model\.layers\.(\d+)\.", name)
    return bool(m) and int(m.group(1)) >= num_hidden_layers


@dataclass
class Reader:
    """Access to the full tensors without materialising them: ``shape(name)``, ``dtype(name)``, and
    ``read(name, dim, start, end)`` (the slice along ``dim``; ``dim`` None = the whole tensor)."""

    names: list[str]
    shape: Callable[[str], tuple[int, ...]]
    is_fp8: Callable[[str], bool]
    read: Callable[[str, int | None, int, int], Tensor]


def dict_reader(tensors: dict[str, Tensor]) -> Reader:
    import torch

    def read(name: str, dim: int | None, start: int, end: int) -> Tensor:
        t = tensors[name]
        return t if dim is None else t.narrow(dim, start, end - start).clone()

    return Reader(list(tensors), lambda n: tuple(tensors[n].shape), lambda n: tensors[n].dtype == torch.float8_e4m3fn,
                  read)


def _slice_fp8(reader: Reader, name: str, dim: int, start: int, end: int, out: dict[str, Tensor]) -> None:
    """An FP8 weight's slice: kept FP8 with its scale blocks when block-aligned, else dequantised to bf16."""
    import torch

    scale_name = f"{name}{SCALE_SUFFIX}"
    full = reader.shape(name)[dim]
    b0, b1 = start // BLOCK, -(-end // BLOCK)
    w = reader.read(name, dim, start, end)
    scale = reader.read(scale_name, dim, b0, b1)
    if start % BLOCK == 0 and (end % BLOCK == 0 or end == full):
        out[name], out[scale_name] = w, scale
        return
    # Partial blocks: expand the covering scales to elements, cut at the slice's offset, dequantise.
    expanded = scale.float().repeat_interleave(BLOCK, dim=dim)
    expanded = expanded.narrow(dim, start - b0 * BLOCK, end - start)
    other = 1 - dim
    expanded = expanded.repeat_interleave(BLOCK, dim=other).narrow(other, 0, w.shape[other])
    out[name] = (w.float() * expanded).to(torch.bfloat16)


def shard_state(reader: Reader, info: RankInfo, num_hidden_layers: int, *, mtp: bool = False) -> dict[str, Tensor]:
    """This rank's tensors (HF names), reading only its slices through ``reader``. MTP layers are dropped unless
    ``mtp`` (speculative decoding): their decoder layer then splits like any other, ``eh_proj`` and the norms
    are replicated, and their copies of the embedding and head are dropped (the main ones serve)."""
    out: dict[str, Tensor] = {}
    names = set(reader.names)
    experts = _expert_count(reader.names) if info.ep > 1 else 0
    for name in reader.names:
        if name.endswith(SCALE_SUFFIX) or (is_mtp(name, num_hidden_layers) and (
                not mtp or name.endswith((".embed_tokens.weight", ".shared_head.head.weight")))):
            continue
        rule = shard_rule(name)
        if experts:  # expert parallelism: this rank's experts whole, the others never read; shared replicated
            j = expert_index(name)
            if j is not None:
                start, end = info.expert_range(experts)
                if not start <= j < end:
                    continue
                rule = None
            elif _SHARED.search(name):
                rule = None
        scale_name = f"{name}{SCALE_SUFFIX}"
        has_scale = scale_name in names and reader.is_fp8(name)
        if rule is None:
            out[name] = reader.read(name, None, 0, 0)
            if has_scale:
                out[scale_name] = reader.read(scale_name, None, 0, 0)
            continue
        start, end = rank_range(rule, reader.shape(name)[rule.dim], info)
        if has_scale:
            _slice_fp8(reader, name, rule.dim, start, end, out)
        else:
            out[name] = reader.read(name, rule.dim, start, end)
    return out


def _expert_count(names: list[str]) -> int:
    """Routed experts per MoE layer: one more than the largest expert index named."""
    top = max((j for j in map(expert_index, names) if j is not None), default=-1)
    return top + 1


def shard_tensors(tensors: dict[str, Tensor], info: RankInfo, num_hidden_layers: int, *,
                  mtp: bool = False) -> dict[str, Tensor]:
    """:func:`shard_state` over an in-memory dict (tests, random models built in memory)."""
    return shard_state(dict_reader(tensors), info, num_hidden_layers, mtp=mtp)


def tensor_bytes(tensors: dict[str, Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())
