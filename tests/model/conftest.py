"""Model tests run single-threaded: the tiny model's ops are small, and on a shared 2-core CI machine
torch's intra-op threads spin against each other (measured 10x slower under load)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
