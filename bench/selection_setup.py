"""Inputs, candidates and exactness metrics of ``bench/selection.py`` (indexer logits and top-k)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

E4M3 = torch.float8_e4m3fn
HEADS, DIM, PAGE, TOPK = 64, 128, 64, 2048


def prefill_inputs(t: int, s: int, gen: torch.Generator) -> dict[str, Tensor]:
    """All-pairs ragged prefill: ``t`` queries each seeing all ``s`` keys (FP8 values, realistic weights)."""
    dev = "cuda"
    q8 = (torch.randn(t, HEADS, DIM, generator=gen, device=dev) * 32).to(E4M3)
    w = torch.randn(t, HEADS, generator=gen, device=dev) * HEADS**-0.5 * 2e-3 * DIM**-0.5
    k8 = (torch.randn(s, DIM, generator=gen, device=dev) * 32).to(E4M3)
    k_scale = torch.exp2(torch.rand(s, generator=gen, device=dev) * 6 - 10)
    ks = torch.zeros(t, dtype=torch.int32, device=dev)
    ke = torch.full((t,), s, dtype=torch.int32, device=dev)
    return {"q8": q8, "w": w, "k8": k8, "k_scale": k_scale, "ks": ks, "ke": ke}


def decode_inputs(batch: int, ctx: int, n_q: int, gen: torch.Generator) -> dict[str, Tensor | int]:
    """Paged decode: ``batch`` requests of ``ctx`` tokens in shuffled 64-token ``index_k_132`` pages."""
    dev = "cuda"
    per = -(-ctx // PAGE)
    pages = batch * per
    k8 = (torch.randn(pages * PAGE, DIM, generator=gen, device=dev) * 32).to(E4M3)
    scale = torch.exp2(torch.rand(pages * PAGE, generator=gen, device=dev) * 6 - 10)
    cache = torch.empty(pages, PAGE * (DIM + 4), dtype=torch.uint8, device=dev)
    cache[:, : PAGE * DIM] = k8.view(torch.uint8).reshape(pages, PAGE * DIM)
    cache[:, PAGE * DIM :] = scale.view(torch.uint8).reshape(pages, PAGE * 4)
    del k8, scale
    table = torch.randperm(pages, generator=gen, device=dev).to(torch.int32).reshape(batch, per)
    q8 = (torch.randn(batch, n_q, HEADS, DIM, generator=gen, device=dev) * 32).to(E4M3)
    w = torch.randn(batch * n_q, HEADS, generator=gen, device=dev) * HEADS**-0.5 * 2e-3 * DIM**-0.5
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    return {"q8": q8, "w": w, "cache": cache, "lens": lens, "table": table, "max_len": ctx}


def topk_logits(rows: int, length: int, pattern: str, gen: torch.Generator) -> Tensor:
    """``[rows, length]`` fp32: ``random`` (normal), ``tied`` (16 distinct values: huge tie groups at the
    threshold) or ``neginf`` (all but ~1000 entries per row ``-inf``: fewer finite values than k)."""
    x = torch.randn(rows, length, generator=gen, device="cuda")
    if pattern == "tied":
        return (x * 4).round().clamp(-8, 7)
    if pattern == "neginf":
        keep = torch.rand(rows, length, generator=gen, device="cuda") < 1000 / length
        return torch.where(keep, x, float("-inf"))
    return x


def logits_error(got: Tensor, want: Tensor) -> tuple[float, bool]:
    """(max |got - want| relative to the row's largest finite |want|, same ``-inf`` pattern)."""
    fin_w, fin_g = torch.isfinite(want), torch.isfinite(got)
    same = bool((fin_w == fin_g).all())
    diff = torch.where(fin_w & fin_g, (got - want).abs(), 0.0)
    scale = torch.where(fin_w, want.abs(), 0.0).amax(dim=1, keepdim=True).clamp_min(1e-30)
    return float((diff / scale).max()), same


def topk_agreement(got: Tensor, ref: Tensor, logits: Tensor) -> tuple[float, float]:
    """(mean fraction of the reference's indices that ``got`` selected, fraction of rows whose selected values
    equal the reference's as multisets: the kit's criterion, which accepts any tie break)."""
    rows, length = logits.shape
    g, r = got.long(), ref.long()
    mask = torch.zeros(rows, length + 1, dtype=torch.bool, device=logits.device)
    mask.scatter_(1, torch.where(r >= 0, r, length), True)
    mask[:, length] = False
    hit = mask.gather(1, torch.where((g >= 0) & (g < length), g, length)).sum(dim=1).float()
    n_ref = (r >= 0).sum(dim=1).clamp_min(1).float()
    agree = float((hit / n_ref).mean())

    def values(idx: Tensor) -> Tensor:
        v = logits.gather(1, idx.clamp(0, length - 1))
        v = torch.where(idx >= 0, v.nan_to_num(nan=float("-inf")), float("nan"))
        return torch.sort(torch.where(torch.isnan(v), float("inf"), v), dim=1).values

    same = (values(g) == values(r)).all(dim=1)
    return agree, float(same.float().mean())


class TorchTopK:
    """``torch.topk`` behind the ``topk.topk`` contract (window mask, row-relative, ``-1`` padded): the plain
    PyTorch baseline and the fallback of the 128K prefill selection when no top-k kernel is registered.

    Exact for finite logits; where a window holds ``-inf`` logits ``torch.topk`` may prefer equal ``-inf``
    entries outside the window, which are then dropped (fewer than ``min(k, n)`` selected)."""

    def topk(self, logits: Tensor, row_starts: Tensor, row_ends: Tensor, k: int) -> Tensor:
        rows, length = logits.shape
        cols = torch.arange(length, device=logits.device)
        inside = (cols >= row_starts[:, None].long()) & (cols < row_ends[:, None].long())
        masked = torch.where(inside & ~torch.isnan(logits), logits, float("-inf"))  # NaN ranks as -inf
        kk = min(k, length)
        idx = torch.topk(masked, kk, dim=1).indices
        n = (row_ends.long() - row_starts.long())[:, None]
        rel = idx - row_starts[:, None].long()
        rank = torch.arange(kk, device=logits.device)[None, :]
        # -inf candidates inside the window are still candidates; past the window length nothing is.
        keep = torch.gather(inside, 1, idx) & (rank < n)
        out = torch.full((rows, k), -1, dtype=torch.int32, device=logits.device)
        out[:, :kk] = torch.where(keep, rel, -1).to(torch.int32)
        return out


@dataclass
class Candidate:
    """One implementation under test: ``fn(inputs) -> output`` and whether it is slow (few timed runs)."""

    name: str
    fn: Callable[[dict], Tensor]
    slow: bool = False


def registered(backend: str, method: str, **needs: object) -> tuple[object | None, str]:
    """The family kernel object of ``backend`` when it is registered, available and claims ``method`` on cuda
    for ``needs``; else ``(None, why)``."""
    from dsa_runtime.plugin_manager import get_manager

    b = get_manager().backends.get(backend)
    if b is None:
        return None, f"backend {backend!r} is not registered"
    ok, why = b.available()
    if not ok:
        return None, f"backend {backend!r} unavailable: {why}"
    reason = b.capabilities.unclaimed_reason(method, device="cuda", **needs)
    if reason:
        return None, f"backend {backend!r}: {reason}"
    try:
        return b.kernel(method.split(".")[0]), ""
    except Exception as exc:  # a half-written kernel module must not end the whole benchmark
        return None, f"backend {backend!r} failed to load: {exc}"
