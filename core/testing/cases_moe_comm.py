"""Expert-parallel all-to-all cases: ``moe_comm.dispatch`` and ``moe_comm.combine`` on random routings.

The cases run on the process group the kit finds: world size 1 in-process when ``torch.distributed`` is not
initialised, else every rank of the default group (each rank runs the same cases in the same order, the
collectives pair up; the expert counts are multiples of 8, so any world size dividing 8 works). Every rank draws
every rank's inputs from the case's seed, so each knows what it should receive without asking.

* ``dispatch`` is judged as a set of rows: every (source rank, token) holding one of this rank's experts appears
  once, with the hidden row bit for bit, its local ids in the token's columns (``-1`` for the experts of other
  ranks) and their weights (``0`` elsewhere); any other row must be padding (ids all ``-1``, source ``-1``).
* ``combine`` runs dispatch, a per-row stand-in for the experts (``x * (1 + sum_j w_j * (id_j + 1))``, padding
  rows filled with garbage that must be ignored) and combine, and compares with the sum computed directly.

Routings: random ids with single ``-1`` entries and padded rows (ids all ``-1``); every token on one expert
(``one_expert``: the other ranks receive nothing); ids from rank 0's experts only (``skewed``, ``-1`` padded
where rank 0 holds fewer than k); no token routed at all (``none``); one token (a decode step); 300 tokens (a
prefill chunk: fixed-capacity backends may switch to exact counts there).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.families import Dispatched, EPGroup
from dsa_runtime.testing import data
from dsa_runtime.testing.case import Case, CheckContext, Inputs
from dsa_runtime.testing.compare import close, expect_tensor
from dsa_runtime.testing.tolerances import tolerance

FAMILY = "moe_comm"
ROUTINGS = ("random", "one_expert", "skewed", "none")


def ep_here(num_experts: int) -> EPGroup:
    """This process's EP group for the kit: the default process group when one is initialised, else one rank."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return EPGroup(dist.get_rank(), dist.get_world_size(), num_experts, dist.group.WORLD)
    return EPGroup(0, 1, num_experts, None)


def _routing(gen: torch.Generator, dev: torch.device, tokens: int, n_exp: int, k: int, routing: str,
             ranks: int) -> Tensor:
    """``[T, k]`` int32 global ids of one source rank, distinct per row, ``-1`` = none."""
    ids = torch.rand(tokens, n_exp, generator=gen, device=dev).argsort(dim=1)[:, :k]
    if routing == "one_expert":
        ids = torch.full_like(ids, -1)
        ids[:, 0] = 0
    elif routing == "skewed":  # only rank 0's experts: every other rank receives nothing
        per = n_exp // ranks
        ids = torch.rand(tokens, per, generator=gen, device=dev).argsort(dim=1)[:, :k]
        ids = torch.cat([ids, torch.full((tokens, k - ids.shape[1]), -1, device=dev, dtype=ids.dtype)], dim=1)
    elif routing == "none":
        ids = torch.full_like(ids, -1)
    else:
        drop = torch.rand(tokens, k, generator=gen, device=dev) < 0.2
        pad = torch.rand(tokens, generator=gen, device=dev) < 0.25
        ids = torch.where(drop | pad[:, None], -1, ids)
    return ids.to(torch.int32)


def _build(tokens: int, n_exp: int, k: int, dim: int, dtype: torch.dtype, routing: str):
    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        ep = ep_here(n_exp)
        every = []
        for _ in range(ep.size):  # every rank draws every rank's inputs, in rank order
            hidden = data.randn(gen, (tokens, dim), dev).to(dtype)
            ids = _routing(gen, dev, tokens, n_exp, k, routing, ep.size)
            weights = data.uniform(gen, (tokens, k), dev, 0.1, 1.0)
            every.append((hidden, ids, weights))
        hidden, ids, weights = every[ep.rank]
        return {"hidden": hidden, "ids": ids, "weights": weights, "ep": ep, "every": every}

    return build


def _expected_rows(a: Inputs) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Rows this rank must receive, sorted by (source rank, row): src_rank, src_row, x, local ids, weights."""
    ep: EPGroup = a["ep"]
    per = ep.experts_per_rank
    parts = []
    for s, (hidden, ids, weights) in enumerate(a["every"]):
        ids = ids.long()
        mine = (ids >= 0) & (ids // per == ep.rank)
        rows = mine.any(dim=1).nonzero().flatten()
        local = torch.where(mine, ids - ep.rank * per, -1)[rows]
        parts.append((torch.full_like(rows, s), rows, hidden[rows], local, torch.where(mine, weights, 0.0)[rows]))
    return tuple(torch.cat(p) for p in zip(*parts, strict=True))  # type: ignore[return-value]


def _valid_sorted(d: Dispatched) -> tuple[Tensor, ...]:
    valid = d.src_rank >= 0
    key = d.src_rank[valid] * (1 << 32) + d.src_row[valid]
    order = key.argsort()
    return tuple(t[valid][order] for t in (d.src_rank, d.src_row, d.x, d.topk_ids.long(), d.topk_weights))


def _check_dispatch(tokens: int, k: int, dim: int, dtype: torch.dtype):
    def check(ctx: CheckContext) -> str | None:
        d = ctx.got
        if not isinstance(d, Dispatched):
            return f"expected a Dispatched, got {type(d).__name__}"
        rows = d.x.shape[0] if isinstance(d.x, Tensor) else -1
        for name, t, shape, dt in (("x", d.x, (rows, dim), dtype), ("topk_ids", d.topk_ids, (rows, k), torch.int32),
                                   ("topk_weights", d.topk_weights, (rows, k), torch.float32),
                                   ("src_rank", d.src_rank, (rows,), torch.int64),
                                   ("src_row", d.src_row, (rows,), torch.int64)):
            if msg := expect_tensor(name, t, shape, dt):
                return msg
        pad = d.src_rank < 0
        if bool((d.topk_ids[pad] >= 0).any()) or bool((d.src_row[pad] >= 0).any()):
            return "a padding row (src_rank -1) carries expert ids or a source row"
        if bool(((d.topk_ids[~pad] < 0).all(dim=1)).any()):
            return "a row with a source token carries no expert of this rank"
        want = _expected_rows(ctx.inputs)
        got = _valid_sorted(d)
        if got[0].numel() != want[0].numel():
            return f"received {got[0].numel()} token rows, expected {want[0].numel()}"
        names = ("src_rank", "src_row", "x", "topk_ids", "topk_weights")
        for name, g, w in zip(names, got, want, strict=True):
            if not torch.equal(g.to(w.device), w):
                bad = (g.to(w.device) != w).reshape(g.shape[0], -1).any(dim=1).nonzero().flatten()[0]
                return (f"{name} differs (tolerance {tolerance('moe_comm.rows').note}); first row from rank "
                        f"{int(want[0][bad])} token {int(want[1][bad])}")
        return None

    return check


def stand_in_experts(d: Dispatched) -> Tensor:
    """A per-row function of the dispatched rows in place of the experts (fp32), garbage on padding rows."""
    ids = d.topk_ids.long()
    scale = 1.0 + (torch.where(ids >= 0, d.topk_weights * (ids + 1), 0.0)).sum(dim=1)
    out = d.x.float() * scale[:, None]
    return torch.where((d.src_rank >= 0)[:, None], out, 1e6)


def _expected_combine(a: Inputs) -> Tensor:
    ep: EPGroup = a["ep"]
    hidden, ids, weights = a["hidden"], a["ids"].long(), a["weights"]
    per = ep.experts_per_rank
    total = torch.zeros(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    for q in range(ep.size):
        mine = (ids >= 0) & (ids // per == q)
        part = 1.0 + torch.where(mine, weights * (ids - q * per + 1), 0.0).sum(dim=1)
        total += torch.where(mine.any(dim=1), part, 0.0)
    return hidden.float() * total[:, None]


def _case(method: str, tokens: int, n_exp: int, k: int, dim: int, dtype: str, routing: str, tier: str) -> Case:
    torch_dtype = getattr(torch, dtype)

    def run(kern: object, a: Inputs) -> object:
        d = kern.dispatch(a["hidden"], a["ids"], a["weights"], a["ep"])  # type: ignore[attr-defined]
        if method == "dispatch":
            return d
        return kern.combine(stand_in_experts(d), d, a["ep"])  # type: ignore[attr-defined]

    def check_combine(ctx: CheckContext) -> str | None:
        return expect_tensor("out", ctx.got, (tokens, dim), torch.float32) or close(
            "out", ctx.got, _expected_combine(ctx.inputs), tolerance("moe_comm.combine"))

    check = _check_dispatch(tokens, k, dim, torch_dtype) if method == "dispatch" else check_combine
    return Case(
        f"moe_comm/{method}/e{n_exp}/k{k}/d{dim}/t{tokens}/{dtype}/{routing}", FAMILY, tier, {},
        _build(tokens, n_exp, k, dim, torch_dtype, routing), run, check,  # type: ignore[arg-type]
        f"expert-parallel {method} over every rank of the default group, {routing} routing",
    )


def cases() -> list[Case]:
    out = []
    for method in ("dispatch", "combine"):
        out += [_case(method, *spec, "quick") for spec in [
            (9, 16, 4, 64, "bfloat16", "random"),
            (6, 8, 2, 32, "float32", "random"),
            (1, 8, 2, 32, "bfloat16", "random"),
            (7, 16, 4, 64, "bfloat16", "one_expert"),
            (5, 16, 8, 32, "float32", "skewed"),
            (4, 8, 2, 32, "bfloat16", "none"),
            (300, 16, 4, 16, "bfloat16", "random"),  # past fixed-capacity backends' decode sizes (prefill chunks)
        ]]
        out += [_case(method, *spec, "full") for spec in [
            (128, 256, 8, 7168, "bfloat16", "random"),
            (64, 256, 8, 7168, "bfloat16", "one_expert"),
        ]]
    return out
