"""Sparse-attention cases at the shapes real kernels claim, and the edges single-change mutants slipped through.

Shapes (quick tier, small batches so the reference stays fast on a CPU): FlashMLA's prefill over a flat bf16
KV buffer and its paged decode over ``bf16`` and ``fp8_656`` caches, each at 64 and 128 heads, top-k 128
and 2048, page size 64, one and two queries per request.

Edges (built on :mod:`dsa_runtime.testing.cases_sparse_attn`'s builders, then changed):

* ``k1``: top-1 selections (the softmax of one score is 1: an ``exp`` or max-subtraction slip shows);
* ``single_key``: a one-token prompt, the KV buffer holds exactly one row (prefill) or every request one
  cached token (decode), so a ``-1`` that is dereferenced lands on the one valid row;
* ``last_row`` / ``last_slot``: the selection includes the last valid row of the buffer (``S - 1``) or the
  last slot of the cache, which an off-by-one validity test (``idx < S - 1``) drops.

Indices are always ``-1`` or a valid row/slot (the contract; the kit never sends ``>= S``).
"""

from __future__ import annotations

import dataclasses

import torch

from dsa_runtime.testing.case import Case, Inputs
from dsa_runtime.testing.cases_sparse_attn import _decode_case, _prefill_case


def _variant(base: Case, variant: str, change, what: str, size: str | None = None) -> Case:
    """``base`` with its last id segment replaced by ``variant`` (and the one before by ``size``, when the
    change alters the buffer size) and its inputs passed through ``change``."""

    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        return change(base.build(gen, dev))

    head = base.id.rsplit("/", 2 if size else 1)[0] + (f"/{size}" if size else "")
    return dataclasses.replace(base, id=f"{head}/{variant}", build=build, description=f"{base.description}; {what}")


def _single_row(a: Inputs) -> Inputs:
    """Keep only row 0 of the KV buffer (the builder's limit was 1, so every index is 0 or -1)."""
    a["kv"] = a["kv"][:1].contiguous()
    return a


def _select_last_row(a: Inputs) -> Inputs:
    """Swap the first query's first selected row with the buffer's last row, so ``S - 1`` is selected."""
    kv, idx = a["kv"], a["indices"]
    last = kv.shape[0] - 1
    r = int(idx[0, 0])
    assert r >= 0
    kv[[r, last]] = kv[[last, r]]  # the loud unselected row moves to r, which nobody selects any more
    a["indices"] = torch.where(idx == r, last, idx).to(torch.int32)
    return a


def _select_last_slot(a: Inputs) -> Inputs:
    """Swap the first query's first selected slot with the cache's last slot (poison, never selected)."""
    cache, idx = a["cache"], a["indices"]
    rows = cache.view(-1, cache.shape[-1])
    last = rows.shape[0] - 1
    s = int(idx.reshape(-1)[0])
    assert s >= 0
    rows[[s, last]] = rows[[last, s]]
    a["indices"] = torch.where(idx == s, last, idx).to(torch.int32)
    return a


def _flashmla_shapes() -> list[Case]:
    out = [_prefill_case(h, 2, k + 200, k, "pad", "quick") for h in (64, 128) for k in (128, 2048)]
    # Every pair of (heads, k), (heads, queries) and (k, queries) values once per layout, to keep CPU time low.
    for layout in ("bf16", "fp8_656"):
        for h, k, n_q in ((64, 128, 1), (64, 2048, 2), (128, 128, 2), (128, 2048, 1)):
            out.append(_decode_case(layout, h, n_q, 64, k, 2, k + 100, "partial_pages", "quick"))
    return out


def _edges() -> list[Case]:
    out = [
        _prefill_case(16, 5, 48, 1, "pad", "quick"),
        _variant(_prefill_case(64, 3, 2, 64, "pad", "quick"), "single_key", _single_row,
                 "the buffer holds one row (a one-token prompt)", size="s1"),
        _variant(_prefill_case(20, 4, 80, 32, "pad", "quick"), "last_row", _select_last_row,
                 "the last row of the buffer (S - 1) is selected"),
    ]
    for layout in ("bf16", "fp8_656"):
        out += [
            _decode_case(layout, 16, 1, 64, 1, 3, 100, "partial_pages", "quick"),
            _variant(_decode_case(layout, 16, 1, 16, 64, 3, 1, "partial_pages", "quick"), "single_key",
                     lambda a: a, "every request has one cached token"),
            _variant(_decode_case(layout, 20, 2, 16, 32, 2, 60, "partial_pages", "quick"), "last_slot",
                     _select_last_slot, "the last slot of the cache is selected"),
        ]
    return out


def cases() -> list[Case]:
    return _flashmla_shapes() + _edges()
