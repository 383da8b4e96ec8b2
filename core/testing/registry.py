"""The kit's case table: one module per family, gathered and filtered here."""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from dsa_runtime.errors import ConfigError
from dsa_runtime.families import FAMILIES
from dsa_runtime.testing.case import Case

CASE_MODULES: dict[str, str] = {family: f"dsa_runtime.testing.cases_{family}" for family in FAMILIES}
# Second modules per family: shapes real kernels can claim and the edge cases that mutants showed missing.
EDGE_CASE_MODULES: dict[str, str] = {family: f"dsa_runtime.testing.edges_{family}" for family in FAMILIES}


def family_cases(family: str) -> list[Case]:
    """All cases (both tiers) of one family: its ``cases_`` module, then its ``edges_`` module."""
    if family not in CASE_MODULES:
        raise ConfigError(f"unknown kernel family {family!r}; valid: {', '.join(FAMILIES)}")
    return importlib.import_module(CASE_MODULES[family]).cases() + importlib.import_module(EDGE_CASE_MODULES[family]).cases()


def all_cases(
    *, full: bool = False, families: Iterable[str] | None = None, keyword: str | None = None
) -> list[Case]:
    """Cases to run, in family order: the quick tier, plus the full tier when ``full``.

    Args:
        families: only these families (default: all five).
        keyword: only cases whose id contains this substring.
    """
    chosen = list(dict.fromkeys(families)) if families else list(FAMILIES)
    out: list[Case] = []
    for family in chosen:
        out += [c for c in family_cases(family) if (full or c.tier == "quick")]
    if keyword:
        out = [c for c in out if keyword in c.id]
    seen: set[str] = set()
    for c in out:
        if c.id in seen:
            raise RuntimeError(f"duplicate conformance case id {c.id!r}")
        seen.add(c.id)
    return out


def method_keys(*, full: bool = True) -> dict[str, list[str]]:
    """``"family.method" -> capability keys its cases check`` (``device`` always, then the keys of the cases'
    ``needs``, sorted), over both tiers by default. ``docs/conformance.md``'s key table is tested against it."""
    from dsa_runtime.families import METHODS

    keys: dict[str, set[str]] = {m: set() for m in METHODS}
    for case in all_cases(full=full):
        keys[case.method].update(case.needs)
    return {m: ["device", *sorted(k)] for m, k in keys.items()}
