"""The Triton FP8 KV kernels on CPU through Triton's interpreter: every quick kv_quant case, every quick
``fp8_656`` decode case (through a test backend whose decode sends ``fp8_656`` to ``decode_fp8_656``), and direct
checks (head counts 1/16/20/128, split = unsplit, all -1, bit-exact stores into poisoned caches)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dsa_runtime.testing.registry import family_cases
from tests.hopper.interp_support import NEEDS_INTERPRETER

pytestmark = NEEDS_INTERPRETER
N_DIRECT = 17


def test_quick_kv_quant_and_fp8_decode_cases_pass_under_the_triton_interpreter():
    here = Path(__file__).parent
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(here), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run(
        [sys.executable, str(here / "interp_kv_fp8.py")], capture_output=True, text=True, env=env, timeout=900,
    )
    lines = run.stdout.strip().splitlines()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    n_kv = sum(c.tier == "quick" for c in family_cases("kv_quant"))
    n_dec = sum(c.tier == "quick" and "/decode/fp8_656/" in c.id for c in family_cases("sparse_attn"))
    assert n_kv >= 16 and n_dec >= 13, (n_kv, n_dec)
    assert len(lines) == n_kv + n_dec + N_DIRECT, lines
    assert all(line.startswith(("passed ", "direct ")) for line in lines), lines
    assert all(line.endswith(": passed") for line in lines if line.startswith("direct ")), lines
