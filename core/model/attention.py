"""Attention over the paged MLA cache for one layer: absorbed (MQA) sparse/dense paths and dense MHA.

Every path reads the keys back from the cache *after* this step's rows were written, so prefill, chunked
prefill and decode see exactly the same stored values (bf16 rows, or FP8 rows whose ue8m0 scales make the
bf16 dequantisation exact) and agree with each other.

* decode rows (:func:`decode_attention`; every row of a graphed step, and the short runs of an eager one):
  ``kernels.sparse_attn.decode`` over the paged cache, indices = cache locations from the rows' block tables:
  for DSA the indexer's top-k (``logits_paged`` + ``topk_transform``, which gives a row of at most
  ``index_topk`` tokens every one of its positions); for the V3 family every visible slot. Shapes depend on
  the row count and the table width only, so the path is graph-safe.
* prefill chunks, absorbed (all of a step's at once): each chunk's rows ``0 .. end-1`` gathered and
  dequantised into one flat bf16 buffer (``kernels.kv_quant.dequantize_mla``), one
  ``kernels.sparse_attn.prefill`` call with indices into it: top-k of ``logits_ragged`` over the chunk's cached
  index keys (``gather_index_k``), or every causal position.
* prefill chunk, MHA (dense: DSA ``end <= index_topk``, V3 ``end <= mha_max_keys``; on CPU also a sparse
  DSA chunk with ``end <= mha_max_keys``, over the indexer's top-k selection): per-head ``k_nope = W_UK c``
  and ``v = W_UV c`` from the cached latents, softmax in fp32; chunks of equal start and length batched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from dsa_runtime.model.batch import SeqMeta, StepMeta, pack_in_order
from dsa_runtime.model.index_select import default_budget, select_topk_ragged

DENSE_WIDTH_MULTIPLE = 64  # dense (V3) index sets are padded to this, the granularity GPU kernels claim


@dataclass
class DecodeTables:
    """Tensor-only metadata of a step's decode rows: no per-sequence Python objects.

    lens ``[B]`` int32: tokens each row sees, itself included; table ``[B, P]`` int32: each row's block table
    (a padded row: page 0, length 1); rows ``[B]`` int32 ``0 .. B-1`` and starts ``[B]`` int32 zeros (the
    top-k's row map and window starts); width: the indexer logits' width, ``P * page_size`` (static across
    replays of one graph); index: ``[B]`` int64, the step's token rows that are decode rows (None: every row).
    """

    lens: Tensor
    table: Tensor
    rows: Tensor
    starts: Tensor
    width: int
    index: Tensor | None = None


@dataclass
class AttnContext:
    """What the attention of every layer shares in one step."""

    kernels: object
    step: StepMeta
    kv_layout: str
    sm_scale: float
    index_topk: int | None  # None: dense V3 family
    mha_max_keys: int  # dense prefill with at most this many keys uses MHA (0: never)
    index_scale_fmt: str
    index_budget_bytes: int | None = None  # indexer logits + top-k workspace per row chunk (None: default)
    # Sparse prefill chunks with at most this many keys run MHA over the indexer's selected keys (0: never).
    # On CPU at few heads the per-head form costs a third of the absorbed (576-wide) scores.
    sparse_mha_max_keys: int = 0
    # The step's decode rows (all of a graphed step's); step.seqs holds its prefill chunks only.
    decode: DecodeTables | None = None

    def is_dense(self, seq: SeqMeta) -> bool:
        return self.index_topk is None or seq.end_pos <= self.index_topk

    def uses_mha(self, seq: SeqMeta) -> bool:
        if seq.is_decode:
            return False
        return seq.end_pos <= (self.mha_max_keys if self.is_dense(seq) else self.sparse_mha_max_keys)

    def needs_index_queries(self) -> bool:
        if self.index_topk is None:
            return False
        return self.decode is not None or any(not self.is_dense(s) for s in self.step.seqs)

    def index_width(self, longest: int) -> int:
        """Width K of the index tensors: ``index_topk`` for DSA (what the kernels were resolved for, dense
        rows padded with -1); for the V3 family the longest visible context rounded up to 64."""
        if self.index_topk is not None:
            return self.index_topk
        return -(-longest // DENSE_WIDTH_MULTIPLE) * DENSE_WIDTH_MULTIPLE

    def __post_init__(self) -> None:
        # Per-step tables shared by every layer (decode index tables, MHA groups): built on first use.
        self.memo: dict[object, object] = {}
        self.reuse_topk = False  # set by each layer: IndexCache "S" layers reuse the indices of the last "F"

    def shared_topk(self, site: object, compute: Callable[[], Tensor]) -> Tensor:
        """IndexCache: the top-k indices of one selection ``site`` of the step (decode rows, a prefill group):
        a Full layer computes them (``compute()``) and keeps them for the layers after it, a Shared layer
        (:attr:`reuse_topk`) takes the last Full layer's. Indices are cache locations or step-local positions, the same
        for every layer of the step."""
        key = ("topk", site)
        if self.reuse_topk:
            got = self.memo.get(key)
            if got is None:
                raise RuntimeError(f"IndexCache: no earlier Full layer selected for {site!r} this step")
            return got  # type: ignore[return-value]
        got = compute()
        self.memo[key] = got
        return got


def decode_attention(ctx: AttnContext, q: Tensor, kv_cache: Tensor, index_cache: Tensor | None, iq) -> Tensor:
    """q ``[B, H, 576]`` of the step's decode rows (``ctx.decode``) -> latent outputs ``[B, H, 512]``.

    Graph-safe: shapes depend on B and the static width only, never on the lengths' values. DSA rows all go
    through the indexer over the static width and the top-k with per-row lengths (a row of at most
    ``index_topk`` tokens gets every one of its positions); V3 rows take every visible slot of the width, ``-1``
    past their length. ``iq`` holds the indexer queries of every token row of the step.
    """
    t = ctx.decode
    kernels, ps = ctx.kernels, ctx.step.page_size
    if ctx.index_topk is not None:
        def select() -> Tensor:
            q8, w = iq.q8, iq.weights
            if t.index is not None:
                q8, w = q8.index_select(0, t.index), w.index_select(0, t.index)
            logits = kernels.indexer.logits_paged(q8.unsqueeze(1), w, index_cache, t.lens, t.table, t.width)
            return kernels.topk.topk_transform(logits, t.starts, t.lens, ctx.index_topk, t.table, t.rows, ps)

        indices = ctx.shared_topk("decode", select)
    else:
        width = -(-t.width // DENSE_WIDTH_MULTIPLE) * DENSE_WIDTH_MULTIPLE
        pos = torch.arange(width, device=q.device)
        page = (pos // ps).clamp_max(t.table.shape[1] - 1)
        locs = t.table[:, page].long() * ps + pos % ps
        indices = torch.where(pos[None, :] < t.lens[:, None], locs, -1)
    out, _lse = kernels.sparse_attn.decode(q.unsqueeze(1), kv_cache, indices.to(torch.int32).unsqueeze(1),
                                           ctx.sm_scale, layout=ctx.kv_layout)
    return out[:, 0]


# Cache rows gathered at once for one group of absorbed prefill chunks ([rows, 576] bf16: 288 MiB at most).
MAX_GATHER_ROWS = 1 << 18


def _prefill_groups(ctx: AttnContext, seqs: list[SeqMeta], device) -> list[dict]:
    """Tables of the step's absorbed prefill chunks, built once per step (every layer reuses them).

    Chunks are grouped in order so that a group's cache rows stay under ``MAX_GATHER_ROWS`` (a chunk longer
    than that is a group of its own). Per group: ``rows`` ``[n]`` int64, the token rows of its chunks;
    ``locs`` ``[S]`` int64, the cache locations of every chunk's positions ``0 .. end-1``, concatenated;
    ``base`` ``[n]`` int64, each row's chunk offset in that buffer; ``ends`` ``[n]`` int32, ``base`` + position
    + 1 (a row sees buffer rows ``[base, ends)``); ``sparse`` ``[n]`` bool, rows of chunks that go through
    the indexer (None when none does, True-only groups have ``all_sparse``); ``width``, the index width
    (:meth:`AttnContext.index_width`: ``index_topk`` for DSA, the longest dense chunk rounded up for V3).
    """
    key = ("prefill", tuple(s.index for s in seqs))
    groups = ctx.memo.get(key)
    if groups is not None:
        return groups  # type: ignore[return-value]
    groups = []
    for part in pack_in_order(seqs, lambda s: s.end_pos, MAX_GATHER_ROWS):
        lengths = torch.tensor([s.length for s in part], device=device)
        ends_pos = [s.end_pos for s in part]
        offsets = torch.tensor([0] + ends_pos[:-1], device=device).cumsum(0)
        rows = torch.cat([torch.arange(s.t0, s.t1, device=device) for s in part])
        base = offsets.repeat_interleave(lengths)
        dense = [ctx.is_dense(s) for s in part]
        groups.append({
            "rows": rows,
            "locs": torch.cat([ctx.step.locs_of(s) for s in part]),
            "base": base,
            "ends": (base + ctx.step.positions[rows] + 1).to(torch.int32),
            "sparse": None if all(dense) else torch.tensor(dense, device=device).logical_not_().repeat_interleave(
                lengths),
            "all_sparse": not any(dense),
            "width": ctx.index_width(max((e for e, d in zip(ends_pos, dense, strict=True) if d), default=1)),
        })
    ctx.memo[key] = groups
    return groups


def prefill_absorbed(ctx: AttnContext, seqs: list[SeqMeta], q: Tensor, kv_cache: Tensor,
                     index_cache: Tensor | None, iq) -> list[tuple[Tensor, Tensor]]:
    """The absorbed attention of every prefill chunk in ``seqs``, batched: q ``[T, H, 576]`` (the step's rows)
    -> per group of chunks, its token rows ``[n]`` and latent outputs ``[n, H, 512]``.

    A group's cache rows are gathered (dequantised when FP8) into one flat bf16 buffer and attended by one
    ``sparse_attn.prefill`` call with indices into that buffer: every causal position of a dense chunk, the
    indexer's top-k (``logits_ragged`` over the chunk's cached index keys, in row chunks within the budget)
    of a sparse one. A row's indices depend only on its own chunk, so batching changes no selected key.
    """
    kernels = ctx.kernels
    flat = kv_cache.reshape(-1, kv_cache.shape[-1])
    results = []
    for gi, g in enumerate(_prefill_groups(ctx, seqs, q.device)):
        rows, base, ends, sparse = g["rows"], g["base"], g["ends"], g["sparse"]
        kv = kernels.kv_quant.dequantize_mla(flat.index_select(0, g["locs"]), layout=ctx.kv_layout)
        indices = None
        if not g["all_sparse"]:
            cols = torch.arange(g["width"], device=q.device)
            indices = torch.where(cols[None, :] < (ends - base)[:, None], base[:, None] + cols[None, :], -1)
            indices = indices.to(torch.int32)
        if sparse is not None:
            ks = base if g["all_sparse"] else base[sparse]

            def select(g=g, sparse=sparse, ks=ks) -> Tensor:
                k8, k_scale = kernels.kv_quant.gather_index_k(index_cache, g["locs"])
                rows, ends = g["rows"], g["ends"]
                pick = rows if g["all_sparse"] else rows[sparse]
                ke = ends if g["all_sparse"] else ends[sparse]
                # Logits and top-k in row chunks within the budget (never a full [rows, keys] matrix of a long
                # chunk); positions come back relative to each row's chunk start, hence + ks.
                rel = select_topk_ragged(kernels, iq.q8[pick], iq.weights[pick], k8, k_scale, ks.to(torch.int32),
                                         ke, ctx.index_topk,
                                         budget_bytes=ctx.index_budget_bytes or default_budget(q.device))
                return torch.where(rel >= 0, rel + ks[:, None].to(rel.dtype), -1).to(torch.int32)

            picked = ctx.shared_topk(("absorbed", tuple(s.index for s in seqs), gi), select)
            if indices is None:
                indices = picked
            else:
                indices[sparse] = picked
        out, _lse = kernels.sparse_attn.prefill(q.index_select(0, rows), kv, indices, ctx.sm_scale)
        results.append((rows, out))
    return results


def mha_groups(ctx: AttnContext) -> list[list[SeqMeta]]:
    """The step's MHA prefill chunks grouped by (start_pos, length): one group runs as one batched product
    (equal shapes and causal masks). Built once per step."""
    groups = ctx.memo.get("mha_groups")
    if groups is None:
        by_shape: dict[tuple[int, int], list[SeqMeta]] = {}
        for s in ctx.step.seqs:
            if ctx.uses_mha(s):
                by_shape.setdefault((s.start_pos, s.length), []).append(s)
        groups = ctx.memo["mha_groups"] = list(by_shape.values())
    return groups  # type: ignore[return-value]


def _group_tables(ctx: AttnContext, group: list[SeqMeta], device) -> tuple[Tensor, Tensor, Tensor]:
    """Token rows ``[G, len]``, cache locations ``[G, end]`` and positions ``[len]`` of one MHA group (memoised)."""
    key = ("mha", group[0].index)
    got = ctx.memo.get(key)
    if got is None:
        ps, first = ctx.step.page_size, group[0]
        t0 = torch.tensor([s.t0 for s in group], device=device)
        rows = t0[:, None] + torch.arange(first.length, device=device)[None, :]
        pos = torch.arange(first.end_pos, device=device)
        tables = ctx.step.tables_of(group)[:, : -(-first.end_pos // ps)]  # equal lengths: no padding
        locs = tables[:, pos // ps] * ps + pos % ps
        got = ctx.memo[key] = (rows, locs, ctx.step.positions[first.t0:first.t1])
    return got  # type: ignore[return-value]


def _selected(ctx: AttnContext, group: list[SeqMeta], rows: Tensor, locs: Tensor, index_cache: Tensor,
              iq) -> Tensor:
    """``[G, len, end]`` bool: the keys the indexer selects for each row (the calls of the absorbed path)."""
    kernels = ctx.kernels
    n_seq, length = rows.shape
    end = locs.shape[1]
    k8, k_scale = kernels.kv_quant.gather_index_k(index_cache, locs.reshape(-1))
    ends = (ctx.step.positions[group[0].t0:group[0].t1] + 1).to(torch.int32)
    starts = torch.zeros_like(ends)
    picked = torch.zeros(n_seq, length, end + 1, dtype=torch.bool, device=rows.device)
    budget = ctx.index_budget_bytes or default_budget(rows.device)
    for g in range(n_seq):
        r, seg = rows[g], slice(g * end, (g + 1) * end)
        idx = select_topk_ragged(kernels, iq.q8[r], iq.weights[r], k8[seg], k_scale[seg], starts, ends,
                                 ctx.index_topk, budget_bytes=budget).long()
        picked[g].scatter_(1, torch.where(idx >= 0, idx, end), True)  # -1 marks a column past the keys
    return picked[..., :end]


def prefill_mha(ctx: AttnContext, group: list[SeqMeta], q_nope: Tensor, q_pe: Tensor, kv_cache: Tensor,
                w_kv: Tensor, v_dim: int, index_cache: Tensor | None = None, iq=None) -> tuple[Tensor, Tensor]:
    """Causal MHA for a group of chunks of equal start and length (see :func:`mha_groups`): over every
    visible key for a dense chunk, over the indexer's top-k selection (``iq``) for a sparse one.

    q_nope ``[T, H, nope]``, q_pe ``[T, H, rope]`` (the whole step's rows); w_kv ``[512, H * (nope + v)]``
    in the model dtype (kv_b_proj transposed): per-head keys and values rebuilt from the cached latents by
    one GEMM in the model dtype (as the absorbed path rounds its 576-wide query to it), attention in fp32.
    Returns the group's token rows ``[G * len]`` and their outputs ``[G * len, H, v]`` fp32.
    """
    device = q_nope.device
    rows, locs, pos = _group_tables(ctx, group, device)
    n_seq, length = rows.shape
    end = locs.shape[1]
    heads, nope = q_nope.shape[1], q_nope.shape[2]
    flat = kv_cache.reshape(-1, kv_cache.shape[-1])
    kv = ctx.kernels.kv_quant.dequantize_mla(flat.index_select(0, locs.reshape(-1)), layout=ctx.kv_layout)
    d_lat = w_kv.shape[0]
    # Scores and softmax in fp32: bf16 scores (|s| ~ 10, ulp 0.06) would add far more noise than the
    # absorbed path has; the projection's bf16 rounding (relative 2^-9) is the absorbed query's.
    kn_v = (kv[:, :d_lat].to(w_kv.dtype) @ w_kv).float().view(n_seq, end, heads, nope + v_dim)
    kv = kv.float()
    k_nope = kn_v[..., :nope].permute(0, 2, 3, 1).reshape(n_seq * heads, nope, end)  # [G * H, nope, end]
    values = kn_v[..., nope:].transpose(1, 2).reshape(n_seq * heads, end, v_dim)
    k_pe = kv[:, d_lat:].view(n_seq, end, -1).transpose(1, 2)  # [G, rope, end]: shared by the heads
    flat_rows = rows.reshape(-1)
    qn = q_nope.index_select(0, flat_rows).float().view(n_seq, length, heads, nope)
    qn = qn.transpose(1, 2).reshape(n_seq * heads, length, nope)
    qp = q_pe.index_select(0, flat_rows).float().view(n_seq, length, heads, -1)
    qp = qp.transpose(1, 2).reshape(n_seq, heads * length, -1)
    scores = torch.bmm(qn, k_nope).view(n_seq, heads * length, end)
    scores = scores.baddbmm_(qp, k_pe).mul_(ctx.sm_scale).view(n_seq, heads, length, end)
    if ctx.is_dense(group[0]):
        hidden = torch.arange(end, device=device)[None, :] > pos[:, None]  # [len, end]: row t sees keys <= pos[t]
    else:  # the top-k lies inside each row's causal window
        selected = ctx.shared_topk(("mha", group[0].index),
                                   lambda: _selected(ctx, group, rows, locs, index_cache, iq))
        hidden = ~selected[:, None]  # [G, 1, len, end]
    probs = torch.softmax(scores.masked_fill_(hidden, float("-inf")), dim=-1)
    out = torch.bmm(probs.view(n_seq * heads, length, end), values).view(n_seq, heads, length, v_dim)
    return flat_rows, out.transpose(1, 2).reshape(n_seq * length, heads, v_dim)
