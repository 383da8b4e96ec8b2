"""bench/decode_latency.py on a machine without CUDA: one clear line and exit code 2, nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA refusal")
def test_decode_latency_refuses_without_cuda(tmp_path):
    script = Path(__file__).resolve().parents[1] / "bench" / "decode_latency.py"
    out = tmp_path / "lat.json"
    run = subprocess.run([sys.executable, str(script), "--out", str(out)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip() == "decode_latency: needs a CUDA device"
    assert not out.exists()
