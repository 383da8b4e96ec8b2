"""bench/fewhead_wgmma.py and bench/fewhead_qmma.py without a GPU: they (and bench/fewhead_variants.py) refuse
with one line and exit 2, and the shared memory each asks for is the figure its kernel source's layout adds up
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
    ("fewhead_qmma.py", "fewhead_qmma: needs a Hopper (sm_90) CUDA device"),
])
def test_without_a_gpu_the_kernel_benches_exit_2_with_one_line(tmp_path, script, message):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the bench would run")
    done = subprocess.run([sys.executable, str(BENCH / script), "--json", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip() == message
    assert not (tmp_path / "r.json").exists()


def layout(name: str):
    """The integer value of a ``#define`` of ``bench/<name>`` (a number, or sums / products of earlier ones)."""
    source = (BENCH / name).read_text()
    defines = dict(re.findall(r"^#define (\w+) (.+?)\s*(?://.*)?$", source, flags=re.M))

    def value(key: str) -> int:
        expr = defines[key]
        for other in sorted(defines, key=len, reverse=True):
            if other != key and re.search(rf"\b{other}\b", expr):
                expr = re.sub(rf"\b{other}\b", str(value(other)), expr)
        return int(eval(expr, {"__builtins__": {}}))  # noqa: S307 - arithmetic on the file's own integers

    return value


def test_shared_memory_figure_matches_the_kernel_layout():
    value = layout("fewhead_wgmma.cu")

    assert value("SMEM_BYTES") == value("XCHG_OFF") + 512 + 1024
    assert value("SMEM_BYTES") <= 227 * 1024  # one CTA per SM on Hopper
    assert value("QN_OFF") == 2 * value("TILE_BYTES")  # the two tiles first, each 1024-byte aligned
    assert value("TILE_BYTES") % 1024 == 0 and value("QN_OFF") % 1024 == 0 and value("PB_OFF") % 1024 == 0



def test_fp8_probe_shared_memory_matches_its_layout():
    sys.path.insert(0, str(BENCH))
    import fewhead_qmma

    value = layout("fewhead_qmma.cu")
    assert value("STAGES") == 2
    assert fewhead_qmma.smem_bytes(2) == value("SMEM_USED") + 1024  # + the 1024-byte alignment of the base
    assert 2 * (fewhead_qmma.smem_bytes(2) + 1024) <= 228 * 1024  # two CTAs per SM (1 KB reserved each)
    # the 128-byte swizzled operands sit at 1024-byte boundaries, the ring after them
    for key in ("QH_OFF", "QL_OFF", "QR_OFF", "PB_OFF", "RING_OFF"):
        assert value(key) % 1024 == 0, key
    assert value("RING_OFF") == value("PB_OFF") + 4 * 16 * 128  # four P' blocks of 16 heads x 128 bytes
