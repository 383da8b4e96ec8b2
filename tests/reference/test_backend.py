"""The registered reference backend loads every family by its dotted path and satisfies the Protocols."""

from __future__ import annotations

import pytest

from dsa_runtime.families import FAMILIES, FAMILY_PROTOCOLS
from dsa_runtime.reference.plugin import reference_backend


@pytest.mark.parametrize("family", FAMILIES)
def test_kernel_loads_and_implements_protocol(family):
    kernel = reference_backend().kernel(family)
    assert isinstance(kernel, FAMILY_PROTOCOLS[family])
    assert type(kernel).__name__.startswith("Reference")
