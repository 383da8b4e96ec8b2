"""Model tests run single-threaded: the tiny model's ops are small, and on a shared 2-core CI machine
torch's intra-op threads spin against each other (measured 10x slower under load)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every test here runs on one torch thread (tests/conftest.py)."""
