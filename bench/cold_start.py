"""Cold start on one GPU: process start to the first token of ``dsa-runtime serve`` (embedded model), run twice.

    python bench/cold_start.py [--runs 2] [--real-dims] [--json bench/results/cold_start.json]

The first run finds Triton's on-disk kernel cache as the machine has it (empty on a fresh GPU machine), the
second finds what the first compiled; CUDA graphs are captured again by every process (they do not outlive it).
Each run starts ``serve`` on a free port, waits for ``/health``, sends one chat request for one token, and
reports the time from ``Popen`` to the response. ``--real-dims`` then times ``bench/decode_real_gpu.py`` for one
case (batch 1, 4K context, 4 layers at V3.2's dimensions) the same way, twice: there is no checkpoint at those
dimensions to serve, so its start is building random FP8 weights on the GPU, loading them through the runtime's
loader, filling the cache, compiling and capturing, to the first decode step. Prints a table; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from serve_process import serve_process  # noqa: E402


def serve_to_first_token(timeout_s: float) -> float:
    """Seconds from starting ``serve`` to the response of a one-token chat request."""
    start = time.perf_counter()
    with serve_process([], timeout_s, quiet=True) as url:
        model = json.load(urllib.request.urlopen(url + "/v1/models"))["data"][0]["id"]
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello"}],
                           "max_tokens": 1}).encode()
        request = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout_s) as r:
            r.read()
        return time.perf_counter() - start


def real_dims_first_case(timeout_s: float) -> float:
    """Seconds for ``decode_real_gpu.py`` to finish one case (batch 1, 4K context, a few steps)."""
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        subprocess.run([sys.executable, str(HERE / "decode_real_gpu.py"), "--batches", "1", "--contexts", "4096",
                        "--steps", "2", "--warmup", "1", "--profile-steps", "1", "--json", f"{tmp}/real.json"],
                       check=True, timeout=timeout_s, stdout=subprocess.DEVNULL)
        return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--real-dims", action="store_true", help="also time the real-dimension decode bench's start")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one start may take")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "cold_start.json")
    args = ap.parse_args()
    rows = []
    for i in range(args.runs):
        rows.append({"what": "serve, embedded model: start to first token", "run": i + 1,
                     "seconds": serve_to_first_token(args.timeout)})
        print(f"serve run {i + 1}: {rows[-1]['seconds']:.1f} s", flush=True)
    if args.real_dims:
        for i in range(args.runs):
            rows.append({"what": "real dimensions (4 layers, random FP8 weights): start to first case done",
                         "run": i + 1, "seconds": real_dims_first_case(args.timeout)})
            print(f"real-dims run {i + 1}: {rows[-1]['seconds']:.1f} s", flush=True)
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    print(f"\n| what | run | seconds |  ({device})\n|---|---:|---:|")
    for r in rows:
        print(f"| {r['what']} | {r['run']} | {r['seconds']:.1f} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": device,
                                     "rows": rows}, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
