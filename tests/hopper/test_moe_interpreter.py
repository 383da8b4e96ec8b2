"""The Triton MoE kernels on CPU through Triton's interpreter: every quick MoE case, both scale rules."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _numpy_converts_size1_arrays() -> bool:
    """Triton 3.6's interpreter turns a runtime loop bound into a 1-element array and calls ``int()`` on it,
    which newer numpy releases refuse."""
    import warnings

    import numpy as np

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            int(np.array([1]))
    except TypeError:
        return False
    return True


pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("triton") is None, reason="triton is not installed (the interpreter ships with it)"
    ),
    pytest.mark.skipif(
        not _numpy_converts_size1_arrays(),
        reason="this numpy refuses int() of 1-element arrays, which Triton 3.6's interpreter needs (numpy<2.3 works)",
    ),
]


def test_quick_moe_cases_pass_under_the_triton_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("interp_moe.py"))],
        capture_output=True, text=True, env=env, timeout=600,
    )
    lines = run.stdout.strip().splitlines()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # 7 routing + 8 experts (ue8m0, shared fused) + 4 FP8 (float, shared apart) + the bad-id check
    assert len(lines) == 7 + 8 + 4 + 1, lines
    assert all(" passed " in line for line in lines[:-1]) and lines[-1].startswith("bad-id check: passed")
