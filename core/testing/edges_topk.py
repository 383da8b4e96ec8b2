"""Top-k cases at a real indexer's width, and the edges single-change mutants slipped through.

* ``r64/l65536/k2048``: 64 rows of 64K logits, top-2048 (V3.2's decode shape), rows cycling through heavy
  ties (7 distinct values), few distinct values (3: the k-th boundary falls inside a run tens of thousands
  long) and mostly ``-inf`` (98%: many windows hold fewer finite logits than k, so ``-inf`` entries must be
  selected);
* ``nan``: rows with NaN logits *inside* their window, longer than k: NaN ranks as ``-inf`` (the contract),
  so a kernel that ranks NaN first (``torch.topk``'s order) picks them and fails;
* ``pad_short``: many windows shorter than k whose positions include 0, so padding with position 0 instead
  of ``-1`` shows as a duplicate or a wrong count.
"""

from __future__ import annotations

import dataclasses

import torch

from dsa_runtime.testing.case import Case, Inputs
from dsa_runtime.testing.cases_topk import _topk_case


def _revalue(base: Case, values: str, draw) -> Case:
    """``base`` with in-window logits replaced by ``draw(gen, shape, device)`` (poison outside kept)."""

    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        a = base.build(gen, dev)
        logits = a["logits"]
        cols = torch.arange(logits.shape[1], device=dev)
        inside = (cols >= a["starts"].long()[:, None]) & (cols < a["ends"].long()[:, None])
        a["logits"] = torch.where(inside, draw(gen, tuple(logits.shape), dev), logits)
        return a

    head = base.id.rsplit("/", 1)[0]
    return dataclasses.replace(base, id=f"{head}/{values}", build=build, description=f"{base.description} ({values})")


def _few(gen: torch.Generator, shape: tuple[int, ...], dev: torch.device) -> torch.Tensor:
    return torch.randint(-1, 2, shape, generator=gen, device=dev).float() * 0.5


def _mostly_neginf(gen: torch.Generator, shape: tuple[int, ...], dev: torch.device) -> torch.Tensor:
    x = torch.randn(shape, generator=gen, device=dev)
    return torch.where(torch.rand(shape, generator=gen, device=dev) < 0.98, float("-inf"), x)


def _with_nan(gen: torch.Generator, shape: tuple[int, ...], dev: torch.device) -> torch.Tensor:
    x = torch.randn(shape, generator=gen, device=dev)
    return torch.where(torch.rand(shape, generator=gen, device=dev) < 0.1, float("nan"), x)


def _mixed(gen: torch.Generator, shape: tuple[int, ...], dev: torch.device) -> torch.Tensor:
    """Rows cycle through heavy ties (7 values), few values (3) and mostly ``-inf``: one 64 x 64K case
    instead of three keeps the CPU tier fast."""
    ties = torch.floor(torch.randn(shape, generator=gen, device=dev) * 2).clamp(-3, 3)
    kind = torch.arange(shape[0], device=dev)[:, None] % 3
    return torch.where(kind == 0, ties, torch.where(kind == 1, _few(gen, shape, dev), _mostly_neginf(gen, shape, dev)))


def cases() -> list[Case]:
    return [
        _revalue(_topk_case(64, 65536, 2048, "decode", "randn", "quick"), "ties_few_neginf", _mixed),
        _revalue(_topk_case(16, 512, 32, "full", "randn", "quick"), "nan", _with_nan),
        _revalue(_topk_case(16, 512, 32, "ragged", "randn", "quick"), "nan", _with_nan),
        _topk_case(32, 96, 64, "short", "randn", "quick"),
    ]
