"""Indexer cases at the head counts DeepGEMM's SM90 kernels support (32 and 64), and window edges.

* ``h32``: quantize_q (both scale rules), ragged logits, paged logits at page size 64 (one and two queries);
* ``early_end``: a ragged batch whose every window ends before the last key (the key buffer holds keys of a
  later chunk no query sees yet): columns past the last window end must still be ``-inf``, so a kernel that
  stops at ``max(ends)`` and leaves the rest of the row unwritten (zeros) fails.
"""

from __future__ import annotations

import dataclasses

import torch

from dsa_runtime.testing import data
from dsa_runtime.testing.case import Case, Inputs
from dsa_runtime.testing.cases_indexer import _paged_case, _quant_q_case, _ragged_case
from dsa_runtime.testing.fp8util import random_e4m3


def _early_end(base: Case, extra: int) -> Case:
    """``base`` (a ragged case) with ``extra`` keys appended after every window's end."""

    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        a = base.build(gen, dev)
        k8 = random_e4m3(gen, (extra, a["k8"].shape[1]), dev)
        scale = torch.exp2(data.uniform(gen, (extra,), dev, -10, -4))
        a["k8"] = torch.cat([a["k8"], k8])
        a["k_scale"] = torch.cat([a["k_scale"], scale])
        return a

    head = base.id.rsplit("/", 1)[0]
    return dataclasses.replace(
        base, id=f"{head}/early_end", build=build,
        description=f"{base.description}; every window ends before the last key",
    )


def cases() -> list[Case]:
    out = [_quant_q_case(32, 5, fmt, "random", "bf16", "quick") for fmt in ("ue8m0", "float")]
    out += [_ragged_case(32, 3, 12, "ragged", "quick"), _early_end(_ragged_case(64, 3, 10, "ragged", "quick"), 7)]
    out += [_early_end(_ragged_case(32, 2, 6, "empty", "quick"), 5)]
    out += [_paged_case(32, n_q, 64, 3, 150, "quick") for n_q in (1, 2)]
    return out
