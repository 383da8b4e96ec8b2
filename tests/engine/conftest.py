from __future__ import annotations

import pytest

from dsa_runtime.engine import SamplingParams


@pytest.fixture
def greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
