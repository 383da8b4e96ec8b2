"""The Triton sparse MLA kernels on CPU through Triton's interpreter: every quick bf16 sparse_attn kit case the
triton claims cover, plus direct checks (head counts, K, empty rows, duplicates, d_v, launch shapes, split-K).
fp8_656 decode past 32 heads belongs to ``mla_fp8_decode`` (another module): those cases are listed as not run;
up to 32 heads both layouts run the few-head kernel (``sparse_mla_decode_fewhead``), with direct checks of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.hopper.interp_support import NEEDS_INTERPRETER

pytestmark = NEEDS_INTERPRETER


def test_sparse_attn_cases_pass_under_the_triton_interpreter():
    # One BLAS thread: the interpreter runs many small matmuls, which OpenBLAS's thread pool slows ~100x
    # on a busy 2-core machine.
    env = {**os.environ, "TRITON_INTERPRET": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("interp_sparse_attn.py"))],
        capture_output=True, text=True, env=env, timeout=900,
    )
    lines = run.stdout.strip().splitlines()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    kit = [ln for ln in lines if ln.split()[1].startswith("sparse_attn/")]
    direct = [ln for ln in lines if ln.split()[1].startswith("direct/")]
    assert len(kit) + len(direct) == len(lines), lines
    ran = [ln for ln in kit if not ln.startswith("not_run ")]
    # quick tier: 11 prefill + 11 bf16 decode (3 with 4 MTP queries); edges: 4 prefill + 4 bf16 decode (FlashMLA
    # shapes), 3 + 3 edges; fp8_656 decode up to 32 heads (the few-head kernel): 7 quick + 3 edges
    assert len(ran) == 11 + 11 + 4 + 4 + 3 + 3 + 7 + 3, ran
    assert all(ln.startswith("passed ") for ln in ran), [ln for ln in ran if not ln.startswith("passed ")]
    skipped = [ln for ln in kit if ln.startswith("not_run ")]
    assert skipped and all("/fp8_656/" in ln and "past 32 heads" in ln for ln in skipped), skipped
    assert len(direct) >= 50 and all(ln.startswith("passed ") for ln in direct), direct
    assert sum("direct/fewhead/" in ln for ln in direct) == 27, direct
    assert sum("direct/merge/" in ln for ln in direct) == 2, direct
