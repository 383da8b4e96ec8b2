"""Top-k cases: windowed exact top-k, the page-table transform and the fused transform.

A selection is judged as a set, so any tie-break passes: every entry is ``-1`` or inside the row's window,
valid entries are unique, their count is ``min(k, len)``, and the multiset of their logits equals the true
top-k's (``-inf`` and NaN logits inside the window are candidates like any other; NaN ranks as ``-inf``). Entries outside every window
hold ``+inf``, NaN or ``1e30`` so that a kernel that ignores the window picks them and fails.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.testing import data
from dsa_runtime.testing.case import Case, CheckContext, Inputs
from dsa_runtime.testing.compare import equal, expect_tensor

FAMILY = "topk"
_KEY_NEG_INF = -3.0e38  # stands for an in-window -inf when sorting; below any finite logit used here


def _windows(gen: torch.Generator, dev: torch.device, rows: int, width: int, k: int, kind: str):
    if kind == "full":
        return torch.zeros(rows, dtype=torch.int64, device=dev), torch.full((rows,), width, device=dev)
    if kind == "ragged":
        a, b = data.randint(gen, 0, width + 1, (2, rows), dev)
        return torch.minimum(a, b), torch.maximum(a, b)
    if kind == "short":  # windows shorter than k, some empty, some of one key
        n = data.randint(gen, 0, min(k, width + 1), (rows,), dev)
        n[:2] = torch.tensor([0, 1], device=dev)[: min(2, rows)]
        s = (torch.rand(rows, generator=gen, device=dev) * (width - n + 1)).long()
        return s, s + n
    if kind == "empty":
        s = data.randint(gen, 0, width + 1, (rows,), dev)
        s[0], s[-1] = 0, width
        return s, s.clone()
    if kind == "decode":  # request lengths, one full row and one just under k
        e = data.randint(gen, 1, width + 1, (rows,), dev)
        e[0] = width
        if rows > 1:
            e[1] = max(1, min(k, width) - 1)
        return torch.zeros(rows, dtype=torch.int64, device=dev), e
    if kind == "causal":
        return torch.zeros(rows, dtype=torch.int64, device=dev), torch.arange(1, rows + 1, device=dev)
    raise ValueError(kind)


def _values(gen: torch.Generator, dev: torch.device, rows: int, width: int, kind: str) -> Tensor:
    x = data.randn(gen, (rows, width), dev)
    if kind == "ties":  # few distinct values: the k-th boundary falls inside a run of equal logits
        return torch.floor(x * 2).clamp(-3, 3)
    if kind == "neginf":
        return torch.where(torch.rand(rows, width, generator=gen, device=dev) < 0.4, float("-inf"), x)
    return x


def judge_selection(name: str, idx: object, logits: Tensor, starts: Tensor, ends: Tensor, k: int) -> str | None:
    """The set rules of the module docstring; ``idx`` ``[R, k]`` positions relative to the row start."""
    rows, width = logits.shape
    if msg := expect_tensor(name, idx, (rows, k), torch.int32):
        return msg
    assert isinstance(idx, Tensor)
    pos = idx.long()
    starts, ends = starts.long(), ends.long()
    lens = ends - starts
    valid = pos >= 0
    checks = [("positions outside the window", (pos < -1) | (valid & (pos >= lens[:, None])))]
    srt = pos.sort(dim=1).values
    dup = torch.zeros_like(valid)
    dup[:, 1:] = (srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)
    checks.append(("duplicate positions", dup))
    for what, mask in checks:
        if bool(mask.any()):
            r = int(torch.nonzero(mask.any(dim=1))[0])
            bad = (srt if what.startswith("dup") else pos)[r][mask[r]][:5].tolist()
            return (
                f"{name}: {int(mask.any(dim=1).sum())} rows with {what}; first row {r} "
                f"(window [{int(starts[r])}, {int(ends[r])}), k={k}): {bad}"
            )
    count, want_count = valid.sum(dim=1), lens.clamp(max=k)
    if bool((count != want_count).any()):
        r = int(torch.nonzero(count != want_count)[0])
        return (
            f"{name}: {int((count != want_count).sum())} rows select the wrong number of keys; first row {r} "
            f"(window [{int(starts[r])}, {int(ends[r])}), k={k}): {int(count[r])} valid, expected {int(want_count[r])}"
        )
    # -inf and NaN (which ranks as -inf, per the contract) inside a window are candidates like any other.
    keyed = torch.where((logits == float("-inf")) | logits.isnan(), torch.full_like(logits, _KEY_NEG_INF), logits)
    cols = (starts[:, None] + pos.clamp(min=0)).clamp(max=max(width - 1, 0))
    sel = torch.gather(keyed, 1, cols) if width else torch.zeros_like(pos, dtype=keyed.dtype)
    sel = torch.where(valid, sel, float("-inf")).sort(dim=1, descending=True).values
    colr = torch.arange(width, device=logits.device)
    inside = (colr >= starts[:, None]) & (colr < ends[:, None])
    truth = torch.where(inside, keyed, float("-inf"))
    take = min(k, width)
    best = truth.topk(take, dim=1).values if take else truth[:, :0]
    if take < k:
        best = torch.cat([best, best.new_full((rows, k - take), float("-inf"))], dim=1)
    diff = sel != best
    if bool(diff.any()):
        r = int(torch.nonzero(diff.any(dim=1))[0])
        c = int(torch.nonzero(diff[r])[0])
        return (
            f"{name}: {int(diff.any(dim=1).sum())} rows do not hold the top-{k} values; first row {r} "
            f"(window [{int(starts[r])}, {int(ends[r])})): rank {c} value {float(sel[r, c]):.6g}, "
            f"true top-{k} has {float(best[r, c]):.6g}"
        )
    return None


def _topk_case(rows: int, width: int, k: int, windows: str, values: str, tier: str) -> Case:
    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        if windows == "ragged_batch":
            s, e, _, lens = data.ragged_causal(gen, 3, rows, dev)
            w = sum(lens)
            logits = _values(gen, dev, int(s.numel()), w, values)
        else:
            s, e = _windows(gen, dev, rows, width, k, windows)
            logits = _values(gen, dev, rows, width, values)
        s, e = s.to(torch.int32), e.to(torch.int32)
        return {"logits": data.poison_outside(logits, s, e, gen), "starts": s, "ends": e}

    def run(kern: object, a: Inputs) -> Tensor:
        return kern.topk(a["logits"], a["starts"], a["ends"], k)  # type: ignore[attr-defined]

    def check(ctx: CheckContext) -> str | None:
        a = ctx.inputs
        return judge_selection("topk indices", ctx.got, a["logits"], a["starts"], a["ends"], k)

    shape = f"r{rows}/l{width}" if windows != "ragged_batch" else f"batch3x{rows}"
    return Case(
        f"topk/topk/{shape}/k{k}/{windows}/{values}", FAMILY, tier, {"k": k}, build, run, check,  # type: ignore[arg-type]
        f"top-{k} over {windows} windows, {values} logits",
    )


def _paged_inputs(gen: torch.Generator, dev: torch.device, lens: list[int], rows_per: int, page: int) -> Inputs:
    table, n_pages = data.page_tables(gen, lens, page, dev)
    inverse = torch.full((len(lens), n_pages * page), -1, dtype=torch.int64, device=dev)
    for b, n in enumerate(lens):
        pos = torch.arange(max(1, -(-n // page)) * page, device=dev)
        inverse[b, data.slots_of(table, b, pos, page)] = pos
    owner = torch.arange(len(lens), device=dev).repeat_interleave(rows_per).to(torch.int32)
    return {"table": table, "inverse": inverse, "row_to_batch": owner, "page": page}


def _transform_case(batch: int, k: int, page: int, tier: str) -> Case:
    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        lens = data.randint(gen, 1, 4 * k, (batch,), dev).tolist()
        a = _paged_inputs(gen, dev, lens, 2, page)
        lim = torch.tensor(lens, device=dev).repeat_interleave(2)
        pos = (torch.rand(2 * batch, k, generator=gen, device=dev) * lim[:, None]).long()
        pad = torch.rand(2 * batch, k, generator=gen, device=dev) < 0.25
        pad[0] = False
        pad[1, k // 2 :] = True
        a["positions"] = torch.where(pad, -1, pos).to(torch.int32)
        return a

    def run(kern: object, a: Inputs) -> Tensor:
        return kern.page_table_transform(a["positions"], a["table"], a["row_to_batch"], page)  # type: ignore[attr-defined]

    def check(ctx: CheckContext) -> str | None:
        a = ctx.inputs
        pos = a["positions"].long()
        b = a["row_to_batch"].long()[:, None].expand_as(pos)
        safe = pos.clamp(min=0)
        want = a["table"].long()[b, safe // page] * page + safe % page
        want = torch.where(pos >= 0, want, -1).to(torch.int32)
        if msg := expect_tensor("slots", ctx.got, tuple(pos.shape), torch.int32):
            return msg
        return equal("slots", ctx.got, want, what="slots")

    return Case(
        f"topk/page_table_transform/b{batch}/k{k}/p{page}", FAMILY, tier, {"k": k, "page_size": page},  # type: ignore[arg-type]
        build, run, check, "request positions -> physical slots through the page table, -1 kept",
    )


def _fused_case(batch: int, max_len: int, k: int, page: int, variant: str, tier: str) -> Case:
    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        if variant == "prefill":
            s, e, owner, lens = data.ragged_causal(gen, batch, max_len, dev)
            a = _paged_inputs(gen, dev, lens, 1, page)
            a["row_to_batch"] = owner
            logits = _values(gen, dev, int(s.numel()), sum(lens), "randn")
        else:  # decode with 2 queries per request (MTP): windows [0, len - 1) and [0, len)
            lens = data.randint(gen, 1, max_len + 1, (batch,), dev).tolist()
            if variant == "short":
                lens = [min(n, k - 1) for n in lens]
            a = _paged_inputs(gen, dev, lens, 2, page)
            e = torch.tensor(lens, device=dev).repeat_interleave(2) - torch.tensor([1, 0], device=dev).repeat(batch)
            s = torch.zeros_like(e)
            logits = _values(gen, dev, 2 * batch, max(lens), "ties" if variant == "ties" else "randn")
        a["starts"], a["ends"] = s.to(torch.int32), e.to(torch.int32)
        a["logits"] = data.poison_outside(logits, a["starts"], a["ends"], gen)
        return a

    def run(kern: object, a: Inputs) -> Tensor:
        return kern.topk_transform(  # type: ignore[attr-defined]
            a["logits"], a["starts"], a["ends"], k, a["table"], a["row_to_batch"], page
        )

    def check(ctx: CheckContext) -> str | None:
        a = ctx.inputs
        if msg := expect_tensor("slots", ctx.got, (a["logits"].shape[0], k), torch.int32):
            return msg
        slots = ctx.got.long()
        inv = a["inverse"]
        owner = a["row_to_batch"].long()[:, None].expand_as(slots)
        ok = (slots >= 0) & (slots < inv.shape[1])
        pos = torch.where(ok, inv[owner, slots.clamp(0, inv.shape[1] - 1)], -1)
        stray = ((slots >= 0) & (pos < 0)) | (slots < -1)
        if bool(stray.any()):
            r, c = (int(v) for v in torch.nonzero(stray)[0])
            return f"slots: row {r} entry {c} is slot {int(slots[r, c])}, not a slot of request {int(owner[r, 0])}'s pages"
        # The transform maps top-k's row-relative positions, so the recovered positions are in that frame.
        return judge_selection("slots (as positions)", pos.to(torch.int32), a["logits"], a["starts"], a["ends"], k)

    return Case(
        f"topk/topk_transform/b{batch}/l{max_len}/k{k}/p{page}/{variant}", FAMILY, tier,
        {"k": k, "page_size": page}, build, run, check,  # type: ignore[arg-type]
        "fused top-k + page-table transform, judged after mapping slots back to positions",
    )


def cases() -> list[Case]:
    out = [
        _topk_case(*spec, "quick")
        for spec in [
            (8, 256, 16, "full", "randn"),
            (16, 300, 32, "ragged", "randn"),
            (12, 100, 64, "short", "randn"),
            (6, 64, 8, "empty", "randn"),
            (10, 256, 20, "ragged", "ties"),
            (8, 256, 20, "full", "ties"),
            (8, 200, 48, "ragged", "neginf"),
            (8, 256, 1, "ragged", "randn"),
            (6, 40, 64, "full", "randn"),
            (64, 64, 16, "causal", "randn"),
            (40, 0, 16, "ragged_batch", "randn"),
            (4, 3000, 2048, "decode", "randn"),
            (4, 2500, 2048, "decode", "ties"),
        ]
    ]
    out += [
        _topk_case(*spec, "full")
        for spec in [
            (64, 32768, 2048, "decode", "randn"),
            (16, 131072, 2048, "decode", "randn"),
            (64, 32768, 2048, "decode", "neginf"),
            (64, 65536, 2048, "ragged", "ties"),
            (2500, 0, 2048, "ragged_batch", "randn"),
        ]
    ]
    out += [_transform_case(*spec, "quick") for spec in [(4, 32, 64), (4, 32, 16), (3, 16, 1)]]
    out.append(_transform_case(64, 2048, 64, "full"))
    out += [
        _fused_case(*spec, "quick")
        for spec in [
            (4, 300, 32, 64, "decode"),
            (4, 300, 32, 16, "ties"),
            (3, 50, 64, 64, "short"),
            (3, 40, 16, 64, "prefill"),
        ]
    ]
    out += [_fused_case(64, 32768, 2048, 64, "decode", "full"), _fused_case(3, 3000, 2048, 64, "prefill", "full")]
    return out
