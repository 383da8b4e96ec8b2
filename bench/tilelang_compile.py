"""Offline sm_90a compile of every TileLang sparse MLA candidate (no GPU needed): registers, spills, shared memory.

Each candidate of :data:`dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla.CANDIDATES` is lowered by TileLang
for ``{"kind": "cuda", "arch": "sm_90a"}`` to CUDA source, which is checked for what the kernel relies on
(wgmma GEMMs; the KV gathers predicated on ``0 <= index < n_kv`` with zero-filling cp.async, so an index of
``-1`` is never read; every ``setmaxnreg`` executed by whole warpgroups, ``inc`` / ``dec`` on the right side of
ptxas' launch register count, the counts within the pool: :mod:`...tilelang.setmaxnreg_check`), then compiled with ``nvcc -arch=sm_90a -cubin -Xptxas -v``. nvcc comes from ``$NVCC``,
``$CUDA_HOME/bin`` or the ``nvidia-cuda-nvcc`` wheel (``pip install 'nvidia-cuda-nvcc==13.0.*'
'nvidia-cuda-cccl==13.0.*'``, the same 13.0 as the GPU host, with ``nvidia-cuda-runtime`` / ``-crt`` /
``nvidia-nvvm`` at 13.0 too: CCCL rejects mismatched headers). Exits 1 when a candidate fails to lower or to
compile, 2 when no nvcc is found (the lowering checks still run).

    python3 bench/tilelang_compile.py [--heads 128] [--k 2048] [--keep DIR] [--split]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def find_nvcc() -> str | None:
    """nvcc from $NVCC, $CUDA_HOME/bin, the nvidia-cuda-nvcc wheel, or PATH."""
    if os.environ.get("NVCC"):
        return os.environ["NVCC"]
    if os.environ.get("CUDA_HOME") and Path(os.environ["CUDA_HOME"], "bin", "nvcc").is_file():
        return str(Path(os.environ["CUDA_HOME"], "bin", "nvcc"))
    try:
        import nvidia

        for root in nvidia.__path__:
            for cand in sorted(Path(root).glob("cu*/bin/nvcc")) + sorted(Path(root).glob("cuda_nvcc/bin/nvcc")):
                return str(cand)
    except ImportError:
        pass
    return shutil.which("nvcc")


def nvcc_compile(nvcc: str, src: str, keep: Path | None, label: str) -> dict:
    """``nvcc -cubin -Xptxas -v`` of the source: registers, spill bytes, static shared memory, barriers."""
    import tilelang.env as tl_env

    cuda_root = Path(nvcc).resolve().parent.parent
    incs = [tl_env.TILELANG_TEMPLATE_PATH, tl_env.CUTLASS_INCLUDE_DIR, str(cuda_root / "include" / "cccl")]
    with tempfile.TemporaryDirectory() as tmp:
        cu = Path(keep or tmp) / f"{label}.cu"
        cu.write_text(src)
        cmd = [nvcc, "-arch=sm_90a", "-cubin", "-std=c++20", "-w", "-O3", "--use_fast_math", "-Xptxas", "-v",
               *[f"-I{p}" for p in incs if p], "-o", str(Path(tmp) / f"{label}.cubin"), str(cu)]
        run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode:
        return {"error": (run.stderr or run.stdout).strip().splitlines()[-1][:300]}
    text = run.stdout + run.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return {
        "registers": int(regs.group(1)) if regs else -1,
        "spill_stores": int(spill.group(1)) if spill else -1,
        "spill_loads": int(spill.group(2)) if spill else -1,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--split", action="store_true", help="the split-K (fp32 partial) programs of decode")
    ap.add_argument("--keep", type=Path, help="write each candidate's CUDA source into this folder")
    ap.add_argument("--only", help="compile only candidates whose label contains this")
    args = ap.parse_args()
    from dsa_runtime.plugins.cuda_hopper.tilelang.setmaxnreg_check import setmaxnreg_problems
    from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla import CANDIDATES, cuda_source, source_problems

    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    nvcc = find_nvcc()
    print(f"nvcc: {nvcc or 'not found (lowering checks only)'}", flush=True)
    failed, rows = False, []
    for cfg in CANDIDATES:
        label = cfg.label() + ("_split" if args.split else "")
        if args.only and args.only not in label:
            continue
        t0 = time.time()
        try:
            src, smem = cuda_source(args.heads, args.k, 0.135234, cfg, args.split)
        except Exception as exc:  # noqa: BLE001 - a candidate that does not lower is a result
            print(f"{label:28s} LOWER FAILED: {str(exc).strip().splitlines()[-1][:300]}", flush=True)
            failed = True
            continue
        problems = source_problems(src)
        res = nvcc_compile(nvcc, src, args.keep, label) if nvcc else {}
        if res.get("registers", -1) > 0:  # ptxas' own launch count: setmaxnreg must agree with it
            problems += [p for p in setmaxnreg_problems(src, res["registers"]) if p not in problems]
        secs = time.time() - t0
        if problems or "error" in res:
            failed = True
        rows.append((label, smem, res, problems, secs))
        print(f"{label:28s} smem {smem / 1024:6.1f} KB  "
              + (f"regs {res['registers']:3d}  spill {res['spill_stores']}/{res['spill_loads']} B"
                 if "registers" in res else res.get("error", "not compiled"))
              + (f"  PROBLEMS: {'; '.join(problems)}" if problems else "") + f"  ({secs:.1f} s)", flush=True)
    if not rows and not failed:
        print("no candidate matched")
        return 1
    if failed:
        print("FAILED", flush=True)
        return 1
    return 0 if nvcc else 2


if __name__ == "__main__":
    sys.exit(main())
