#!/usr/bin/env python3
"""Where does DeepGEMM crash? Each step in its own process, so one SIGSEGV does not hide the others.

usage (GPU machine, repository root):  source .gpu-deps/deepgemm.env && python3 tools/gpu/diag_deepgemm.py
        one step only:                  python3 tools/gpu/diag_deepgemm.py --step dg_mqa_logits

Steps, one line each (``ok`` / ``mismatch (max error)`` / ``error (exception)`` / ``crashed (signal)``):

* ``import``, ``cublaslt`` (a DeepGEMM call without its JIT), ``jit_transpose`` (the smallest JIT kernel,
  ``get_mn_major_tma_aligned_tensor``): run first, one after the other, to tell a broken JIT from a bad call;
* ``dg_*``: the four entry points called the way DeepGEMM's own tests at 54e2261 call them (tests/
  test_attention.py, tests/generators.py), on small shapes, against a torch computation;
* ``our_*``: the same kernels through our adapters (Triton quantize + :class:`DeepGEMMIndexer`;
  :class:`DeepGEMMMoE` on both of its paths) against the reference backend.

The ``dg_*`` / ``our_*`` steps run in parallel (nvcc compiles each kernel on first use: ~10-40 s each; the
cache is ``DG_JIT_CACHE_DIR``). A crashed step prints its last Python frames (faulthandler) and the JIT's last
words (compile command / load time, printed unbuffered); with gdb on the machine, the first crashed step is run
again under gdb for a native backtrace. Budget: about 3 minutes.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import shutil
import signal
import subprocess
import sys
import time

SERIAL = ("import", "cublaslt", "jit_transpose")
PARALLEL = ("dg_mqa_logits", "dg_paged_mqa_logits", "dg_contiguous", "dg_masked",
            "our_ragged", "our_paged", "our_moe_contiguous", "our_moe_masked")
STEP_TIMEOUT_S = 140
TOTAL_BUDGET_S = 175
MARK = "STEP-RESULT:"


# --------------------------------------------------------------------------------------------- parent side
def _tail(text: str, keep, n: int) -> list[str]:
    return [ln[:220] for ln in text.splitlines() if keep(ln)][-n:]


def _run_step(name: str, timeout: float, **extra_env: str) -> tuple[str, str, list[str], float]:
    """(status, detail, evidence lines, seconds) of one step run in a child process."""
    t0 = time.time()
    env = dict(os.environ, PYTHONFAULTHANDLER="1", DG_JIT_PRINT_COMPILER_COMMAND="1", DG_JIT_PRINT_LOAD_TIME="1",
               **extra_env)
    try:
        run = subprocess.run([sys.executable, os.path.abspath(__file__), "--step", name], capture_output=True,
                             text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return "timeout", f"> {timeout:.0f} s", _tail(out, lambda ln: ln.strip(), 4), time.time() - t0
    secs = time.time() - t0
    res = [ln for ln in run.stdout.splitlines() if ln.startswith(MARK)]
    jit = _tail(run.stdout, lambda ln: "NVCC" in ln or "Load time" in ln or ln.startswith("  >"), 4)
    if run.returncode < 0:
        sig = signal.Signals(-run.returncode).name
        frames = _tail(run.stderr, lambda ln: "File " in ln or "Fatal Python" in ln, 8)
        return "crashed", sig, frames + [f"last stdout: {ln}" for ln in jit], secs
    if not res:
        return "error", f"exit {run.returncode}", _tail(run.stderr, lambda ln: ln.strip(), 6), secs
    status, _, detail = res[-1][len(MARK):].strip().partition(" ")
    return status, detail, jit if status != "ok" else _tail(run.stdout, lambda ln: ln.startswith("  >"), 3), secs


def _gdb_backtrace(name: str, timeout: float) -> list[str]:
    gdb = shutil.which("gdb")
    if gdb is None:
        return ["(no gdb on this machine: no native backtrace)"]
    cmd = [gdb, "-q", "-batch", "-ex", "set pagination off", "-ex", "handle SIGSEGV stop print", "-ex", "run",
           "-ex", "bt 40", "--args", sys.executable, os.path.abspath(__file__), "--step", name]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [f"(gdb run of {name} past {timeout:.0f} s)"]
    # The native frames above the interpreter's own (Python/, Objects/, Modules/main.c) are the story.
    interp = ("Python/", "Objects/", "Modules/main.c", "pycore_", "libffi", "_ctypes")
    keep = [ln[:220] for ln in run.stdout.splitlines()
            if (ln.startswith("#") and not any(p in ln for p in interp)) or "received signal" in ln]
    return keep[:16] or _tail(run.stdout + run.stderr, lambda ln: ln.strip(), 6)  # the innermost frames first


def _header() -> None:
    import platform

    print(f"python {platform.python_version()}  {sys.executable}")
    for var in ("CUDA_HOME", "DG_JIT_CACHE_DIR", "PYTHONPATH", "CPLUS_INCLUDE_PATH", "DG_JIT_USE_NVRTC"):
        print(f"  {var}={os.environ.get(var, '(unset)')}")
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    for cmd in ([os.path.join(home, "bin", "nvcc"), "--version"], ["g++", "--version"], ["nvidia-smi", "-L"]):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
            print(f"  {os.path.basename(cmd[0])}: {(out[-1] if 'nvcc' in cmd[0] else out[0]) if out else '?'}")
        except Exception as exc:  # noqa: BLE001 (a diagnostic: report and go on)
            print(f"  {cmd[0]}: {type(exc).__name__}: {exc}")
    print(f"  gdb: {shutil.which('gdb') or 'absent'}", flush=True)


def main_parent() -> int:
    start = time.time()
    _header()
    results: dict[str, tuple] = {}

    def report(name: str, res: tuple) -> None:
        status, detail, lines, secs = res
        print(f"[{name:20s}] {status:8s} {detail}  ({secs:.1f} s)", flush=True)
        for ln in lines:
            print(f"      {ln}", flush=True)

    for name in SERIAL:
        results[name] = _run_step(name, STEP_TIMEOUT_S)
        report(name, results[name])
        if name == "import" and results[name][0] != "ok":
            print("deep_gemm does not import: nothing else to try", flush=True)
            return 1
        if name == "jit_transpose" and results[name][0] in ("crashed", "error"):
            # Is it the nvcc path (popen, nvcc, cubin load) or everything JIT? NVRTC compiles in-process.
            res = _run_step(name, STEP_TIMEOUT_S, DG_JIT_USE_NVRTC="1")
            report("jit_transpose NVRTC", res)
    left = TOTAL_BUDGET_S - (time.time() - start)
    with cf.ThreadPoolExecutor(len(PARALLEL)) as pool:
        futs = {n: pool.submit(_run_step, n, max(30.0, min(STEP_TIMEOUT_S, left))) for n in PARALLEL}
        for n in PARALLEL:
            results[n] = futs[n].result()
            report(n, results[n])
    crashed = [n for n in SERIAL + PARALLEL if results[n][0] == "crashed"]
    left = TOTAL_BUDGET_S + 45 - (time.time() - start)
    if crashed and left > 20:
        print(f"native backtrace of {crashed[0]} (gdb):", flush=True)
        for ln in _gdb_backtrace(crashed[0], left):
            print(f"      {ln}", flush=True)
    summary = " ".join(f"{n}={results[n][0]}" for n in SERIAL + PARALLEL)
    print(f"SUMMARY {summary}  total {time.time() - start:.0f} s", flush=True)
    return 0 if all(results[n][0] == "ok" for n in results) else 1


# ---------------------------------------------------------------------------------------------- child side
def _unbuffered_c_stdout() -> None:
    """C stdio unbuffered, so DeepGEMM's printf lines reach the pipe before a crash."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.setvbuf(ctypes.c_void_p.in_dll(libc, "stdout"), None, 2, 0)  # _IONBF
    except Exception:  # noqa: BLE001, S110 (not glibc: the Python-side prints still tell the story)
        pass


def main_child(name: str) -> int:
    import faulthandler

    faulthandler.enable()
    _unbuffered_c_stdout()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if os.environ.get("DSA_DG_SHARE_CXX", "1") == "1":  # 0 reproduces the std::regex crash (docs/hopper.md)
        from dsa_runtime.plugins.cuda_hopper.deepgemm_api import share_cxx_runtime

        share_cxx_runtime()
    from diag_deepgemm_steps import STEPS  # the child alone imports torch and deep_gemm

    try:
        status, detail = STEPS[name]()
    except Exception as exc:  # noqa: BLE001 (DeepGEMM's host asserts arrive as RuntimeError: report them)
        status, detail = "error", f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    print(f"{MARK} {status} {detail}", flush=True)
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step", choices=SERIAL + PARALLEL, help="run one step in this process")
    args = ap.parse_args()
    sys.exit(main_child(args.step) if args.step else main_parent())
