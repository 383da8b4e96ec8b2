"""The server's engine step rate against the engine alone, under one streaming load.

    python bench/serve_vs_engine.py [--concurrency 64 1 8 32 64] [--max-tokens 256] [--out-dir bench/results]

Three runs of ``bench/serve_load.py``'s load (each client sends streaming chat requests back to back, greedy,
EOS ignored), each in a fresh process: ``--engine-only`` (the engine stepped directly, no HTTP), then
``dsa-runtime serve --no-engine-process`` (the engine on a thread of the server process), then ``serve
--engine-process`` (the default on one CUDA device). The
first level warms kernel caches and is left out of the table. Prints engine steps/s and tokens/s per level with
each server's ratio to the engine alone, and writes the three JSON files plus ``serve_vs_engine.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_process import serve_process  # noqa: E402

HERE = Path(__file__).resolve().parent


def _load(extra: list[str], out: Path, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE / "serve_load.py"), "--concurrency", *map(str, args.concurrency),
           "--requests-per-client", str(args.requests_per_client), "--max-tokens", str(args.max_tokens),
           "--out", str(out), *extra]
    subprocess.run(cmd, check=True)
    return json.loads(out.read_text())


def _served(engine_process: bool, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    flags = ["--max-running-requests", str(max(args.concurrency)),
             "--engine-process" if engine_process else "--no-engine-process"]
    with serve_process(flags, args.start_timeout) as url:
        return _load(["--url", url], out, args)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[64, 1, 8, 32, 64],
                    help="client counts, in order; the first level is a warm-up left out of the table")
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--start-timeout", type=float, default=600.0, help="seconds a server may take to start")
    ap.add_argument("--out-dir", type=Path, default=HERE / "results")
    args = ap.parse_args()
    runs = {
        "engine": _load(["--engine-only"], args.out_dir / "serve_vs_engine_engine.json", args),
        "thread": _served(False, args.out_dir / "serve_vs_engine_thread.json", args),
        "process": _served(True, args.out_dir / "serve_vs_engine_process.json", args),
    }
    rows = []
    for i, level in enumerate(runs["engine"]["levels"]):
        if i == 0:
            continue  # warm-up
        row = {"clients": level["concurrency"]}
        for name, run in runs.items():
            lv = run["levels"][i]
            row[name] = {"steps_per_s": lv["engine_steps_per_s"], "tokens_per_s": lv["throughput_tok_s"],
                         "ttft_p50_s": lv["ttft_s"]["p50"], "itl_p99_s": lv["itl_s"]["p99"]}
        rows.append(row)
    print("\n| clients | engine alone steps/s | tok/s | server, thread steps/s (ratio) | tok/s "
          "| server, --engine-process steps/s (ratio) | tok/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        base = r["engine"]["steps_per_s"]
        cells = [f"{r['clients']}", f"{base:.0f}", f"{r['engine']['tokens_per_s']:,.0f}"]
        for name in ("thread", "process"):
            steps = r[name]["steps_per_s"]
            ratio = f"{steps / base:.2f}" if steps is not None and base else "n/a"
            cells += [f"{steps:.0f} ({ratio})" if steps is not None else "n/a", f"{r[name]['tokens_per_s']:,.0f}"]
        print("| " + " | ".join(cells) + " |")
    summary = args.out_dir / "serve_vs_engine.json"
    summary.write_text(json.dumps({"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                   "settings": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2))
    print(f"wrote {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
