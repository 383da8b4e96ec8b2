"""Seeded random inputs shared by the case modules: windows, ragged batches, page tables, poison.

Every function takes the case's ``torch.Generator`` and the device, so a case draws the same inputs on
every run of the same device type.
"""

from __future__ import annotations

import torch
from torch import Tensor


def randn(gen: torch.Generator, shape: tuple[int, ...], device: torch.device, scale: float = 1.0) -> Tensor:
    return torch.randn(shape, generator=gen, device=device) * scale


def uniform(gen: torch.Generator, shape: tuple[int, ...], device: torch.device, lo: float, hi: float) -> Tensor:
    return torch.rand(shape, generator=gen, device=device) * (hi - lo) + lo


def randint(gen: torch.Generator, lo: int, hi: int, shape: tuple[int, ...], device: torch.device) -> Tensor:
    """Integers in ``[lo, hi)`` as int64."""
    return torch.randint(lo, hi, shape, generator=gen, device=device)


def randperm(gen: torch.Generator, n: int, device: torch.device) -> Tensor:
    return torch.randperm(n, generator=gen, device=device)


def i32(x: Tensor | list[int], device: torch.device | None = None) -> Tensor:
    return torch.as_tensor(x, dtype=torch.int32, device=device)


def page_tables(
    gen: torch.Generator, lens: list[int], page_size: int, device: torch.device, spare_pages: int = 2
) -> tuple[Tensor, int]:
    """Block tables ``[B, max_pages]`` int32 of distinct, shuffled physical pages, and the page count.

    Request ``b`` owns ``ceil(lens[b] / page_size)`` pages (at least one). Physical page count = used +
    ``spare_pages`` (at least 2); spare pages belong to no request. The *first and last* physical pages are
    always spare, so slot 0 (a common stand-in for an invalid index) and the last slot (where a dereferenced
    ``-1`` lands) hold poison. Unused table entries point at the last page (some kernels read them; no
    position there is ever selected).
    """
    need = [max(1, -(-n // page_size)) for n in lens]
    max_pages = max(need)
    total = sum(need) + max(2, spare_pages)
    perm = (randperm(gen, total - 2, device) + 1).tolist()
    table = torch.empty(len(lens), max_pages, dtype=torch.int32)
    at = 0
    for b, n in enumerate(need):
        table[b, :n] = torch.tensor(perm[at : at + n], dtype=torch.int32)
        table[b, n:] = total - 1
        at += n
    return table.to(device), total


def slots_of(table: Tensor, b: int, positions: Tensor, page_size: int) -> Tensor:
    """Physical slots of request ``b``'s ``positions`` (int64)."""
    pos = positions.long()
    return table[b].long()[pos // page_size] * page_size + pos % page_size


def poison_outside(logits: Tensor, starts: Tensor, ends: Tensor, gen: torch.Generator) -> Tensor:
    """Fill entries outside each row's ``[start, end)`` with +inf, NaN and huge values (cycled)."""
    rows, width = logits.shape
    cols = torch.arange(width, device=logits.device)
    inside = (cols >= starts.long()[:, None]) & (cols < ends.long()[:, None])
    kind = torch.randint(0, 3, (rows, width), generator=gen, device=logits.device)
    garbage = torch.where(
        kind == 0,
        torch.full_like(logits, float("inf")),
        torch.where(kind == 1, torch.full_like(logits, float("nan")), torch.full_like(logits, 1e30)),
    )
    return torch.where(inside, logits, garbage)


def ragged_causal(
    gen: torch.Generator, n_requests: int, max_len: int, device: torch.device, min_len: int = 1
) -> tuple[Tensor, Tensor, Tensor, list[int]]:
    """A ragged prefill batch: requests concatenated; row t sees its request's keys up to itself.

    Returns ``starts``, ``ends`` (``[T]`` int32 windows into the concatenated keys), ``row_to_batch`` and the
    request lengths.
    """
    lens = randint(gen, min_len, max_len + 1, (n_requests,), gen.device).tolist()
    starts, ends, owner = [], [], []
    offset = 0
    for b, n in enumerate(lens):
        for t in range(n):
            starts.append(offset)
            ends.append(offset + t + 1)
            owner.append(b)
        offset += n
    return i32(starts, device), i32(ends, device), i32(owner, device), lens
