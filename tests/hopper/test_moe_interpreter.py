"""The Triton MoE kernels on CPU through Triton's interpreter: every quick MoE case, both scale rules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.hopper.interp_support import NEEDS_INTERPRETER

pytestmark = NEEDS_INTERPRETER


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
