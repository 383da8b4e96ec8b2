"""The ``torch`` backend passes every quick-tier conformance case against the reference, and claims them all."""

from __future__ import annotations

from dsa_runtime.families import FAMILIES, FAMILY_PROTOCOLS
from dsa_runtime.testing import run_conformance
from dsa_runtime.torch_kernels.backend import torch_backend


def test_every_family_loads_and_implements_its_protocol():
    backend = torch_backend()
    for family in FAMILIES:
        kernel = backend.kernel(family)
        assert isinstance(kernel, FAMILY_PROTOCOLS[family]), family
        assert type(kernel).__name__.startswith("Torch"), family


def test_quick_tier_passes_every_case():
    report = run_conformance("torch", device="cpu", progress=False, isolate=False)
    summary = report.summary
    failures = [f"{c.id}: {c.status}: {c.message}" for c in report.cases if c.status != "passed"]
    assert not failures, "\n".join(failures[:10])
    assert summary["passed"] >= 130 and summary["not_claimed"] == 0, summary
    assert report.ok
