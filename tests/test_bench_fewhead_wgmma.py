"""bench/fewhead_wgmma.py without a GPU: it (and bench/fewhead_variants.py) refuses with one line and exit 2, the
shared memory it asks for is read from the kernel source, and that figure is the one the source's layout adds up
to."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="needs the triton package (pip install -e '.[test]')")
torch = pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize(("script", "message"), [
    ("fewhead_wgmma.py", "fewhead_wgmma: needs a Hopper (sm_90) CUDA device"),
    ("fewhead_variants.py", "fewhead_variants: needs a CUDA device of compute capability 8.9 or later"),
])
def test_without_a_gpu_the_kernel_benches_exit_2_with_one_line(tmp_path, script, message):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the bench would run")
    done = subprocess.run([sys.executable, str(BENCH / script), "--json", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip() == message
    assert not (tmp_path / "r.json").exists()


def test_shared_memory_figure_matches_the_kernel_layout():
    source = (BENCH / "fewhead_wgmma.cu").read_text()
    defines = dict(re.findall(r"^#define (\w+) (.+?)\s*(?://.*)?$", source, flags=re.M))

    def value(name: str) -> int:  # the offsets are numbers or sums / products of earlier defines
        expr = defines[name]
        for other in sorted(defines, key=len, reverse=True):
            if other != name and re.search(rf"\b{other}\b", expr):
                expr = re.sub(rf"\b{other}\b", str(value(other)), expr)
        return int(eval(expr, {"__builtins__": {}}))  # noqa: S307 - arithmetic on the file's own integers

    assert value("SMEM_BYTES") == value("XCHG_OFF") + 512 + 1024
    assert value("SMEM_BYTES") <= 227 * 1024  # one CTA per SM on Hopper
    assert value("QN_OFF") == 2 * value("TILE_BYTES")  # the two tiles first, each 1024-byte aligned
    assert value("TILE_BYTES") % 1024 == 0 and value("QN_OFF") % 1024 == 0 and value("PB_OFF") % 1024 == 0

