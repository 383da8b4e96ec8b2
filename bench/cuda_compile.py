"""Compile our CUDA C++ kernels (``plugins/cuda_hopper/cuda/*.cu``: the few-head ``fp8_656`` decode and the top-k
scan) for sm_90 with NVRTC, no GPU needed, and print each configuration's registers, spills and SASS instruction
mix (Triton's bundled ``cuobjdump``).

    DSA_NVRTC_LIB=/path/to/libnvrtc.so.12 python bench/cuda_compile.py

NVRTC comes with torch's CUDA wheels; on a CPU-only machine ``pip download nvidia-cuda-nvrtc-cu12`` and unzip it.
Exits 1 when a configuration spills to local memory.
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from dsa_runtime.plugins.cuda_hopper.cuda import fewhead_fp8, nvrtc, topk_scan
from dsa_runtime.plugins.cuda_hopper.cuda.fewhead_fp8 import CudaFewHeadConfig

FEWHEAD = (CudaFewHeadConfig(), CudaFewHeadConfig(stages=3), CudaFewHeadConfig(stages=4),
           CudaFewHeadConfig(min_blocks=3), CudaFewHeadConfig(l2_prefetch=0), CudaFewHeadConfig(l2_prefetch=256),
           CudaFewHeadConfig(partial_fp16=False))
SCAN = ((2, 256), (4, 256), (2, 128), (2, 512))  # (round steps, threads)


def targets():
    """(label, source, options) of every configuration compiled."""
    for cfg in FEWHEAD:
        yield f"fewhead {cfg.label}", fewhead_fp8._source(), cfg.options
    for steps, threads in SCAN:
        yield f"topk_scan r{steps} t{threads}", topk_scan._source(), (f"-DROUND={steps}", f"-DTHREADS={threads}")


def cuobjdump() -> str:
    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if bundled.exists() else (shutil.which("cuobjdump") or "cuobjdump")


def main() -> int:
    try:
        nvrtc.nvrtc()
    except nvrtc.NvrtcUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    spilled = False
    print("| config | registers | stack bytes | SASS instructions | F2FP | HMMA | PRMT | LDS |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, source, options in targets():
        cubin = nvrtc.compile_cubin(source, "sm_90", options)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            usage = subprocess.run([cuobjdump(), "--dump-resource-usage", f.name], capture_output=True, text=True,
                                   check=True).stdout
            sass = subprocess.run([cuobjdump(), "-sass", f.name], capture_output=True, text=True, check=True).stdout
        regs = int(re.search(r"REG:(\d+)", usage).group(1))
        stack = int(re.search(r"STACK:(\d+)", usage).group(1))
        ops = collections.Counter(op.split(".")[0] for op in re.findall(
            r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass))
        spilled |= stack > 0
        print(f"| {label} | {regs} | {stack} | {sum(ops.values())} | {ops['F2FP']} | {ops['HMMA']} | "
              f"{ops['PRMT']} | {ops['LDS']} |")
    return 1 if spilled else 0


if __name__ == "__main__":
    raise SystemExit(main())
