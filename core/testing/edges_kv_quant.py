"""Edge cases of the kv_quant family (see docs/conformance.md)."""

from __future__ import annotations

from dsa_runtime.testing.case import Case


def cases() -> list[Case]:
    return []
