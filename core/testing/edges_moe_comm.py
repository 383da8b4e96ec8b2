"""Expert-parallel all-to-all edges: a routing where the ids of one token sit on every rank (``k`` equal to the
expert count, so each token reaches every rank once, never twice), and a batch of padded rows only."""

from __future__ import annotations

from dsa_runtime.testing.case import Case
from dsa_runtime.testing.cases_moe_comm import _case


def cases() -> list[Case]:
    return [_case(method, *spec, "quick") for method in ("dispatch", "combine") for spec in [
        (5, 8, 8, 32, "float32", "random"),
        (3, 8, 1, 32, "float32", "none"),
    ]]
