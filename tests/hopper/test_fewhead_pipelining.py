"""The few-head decode kernel's row gathers stay asynchronous (``cp.async``) when compiled for sm_90.

Triton 3.6 left a gather synchronous when its tile fed two dots, and the FP8 kernel ran 20% slower for it (the
dated benchmark record, ``git show fb68c47:docs/benchmarks.md``); ``bench/fewhead_compile.py`` compiles the
default configurations on this machine (no GPU needed) and counts the gathers in the TTGIR.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="needs the triton package (pip install -e '.[test]')")


def test_every_row_gather_of_the_few_head_kernel_is_pipelined():
    script = Path(__file__).resolve().parents[2] / "bench" / "fewhead_compile.py"
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    rows = [ln.split("|")[1:-1] for ln in run.stdout.splitlines() if ln.startswith("| fp8") or ln.startswith("| bf16")]
    assert {(r[0].strip(), r[1].strip()) for r in rows} == {("fp8_656", "cols"), ("fp8_656", "fold"), ("bf16", "cols")}
    for r in rows:
        assert int(r[5]) > 0 and int(r[6]) == 0, r
