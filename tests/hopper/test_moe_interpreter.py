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
    # every quick case once (ue8m0, shared fused), the FP8 expert cases again (float), then the bad-id check
    from dsa_runtime.testing.registry import family_cases

    quick = [c.id for c in family_cases("moe") if c.tier == "quick"]
    n_cases = len(quick) + sum("/fp8/" in c for c in quick)
    assert len(lines) == n_cases + 5 + 1, lines
    assert all(" passed " in line for line in lines[:n_cases]), lines
    assert all(line.startswith("align-small check") and line.endswith("passed") for line in lines[n_cases:-1]), lines
    assert lines[-1].startswith("bad-id check: passed"), lines
