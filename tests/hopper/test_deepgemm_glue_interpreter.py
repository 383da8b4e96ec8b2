"""The DeepGEMM adapter's Triton glue on CPU through Triton's interpreter (stand-in ``deep_gemm``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.hopper.interp_support import NEEDS_INTERPRETER

pytestmark = NEEDS_INTERPRETER


def test_deepgemm_prefill_glue_matches_torch_glue_and_reference_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("interp_deepgemm_glue.py"))],
                         capture_output=True, text=True, env=env, timeout=600, cwd=Path(__file__).parents[2])
    lines = run.stdout.strip().splitlines()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert len(lines) == 8 and all(ln.startswith("passed ") for ln in lines), lines
