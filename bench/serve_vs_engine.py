"""The server's engine step rate against the engine alone, under one streaming load.

    python bench/serve_vs_engine.py [--concurrency 64 1 8 32 64] [--max-tokens 256] [--out-dir bench/results]
    python bench/serve_vs_engine.py --client openai --servers process --concurrency 64 1 64 128

Three runs of ``bench/serve_load.py``'s load (each client sends streaming chat requests back to back, greedy,
EOS ignored), each in a fresh process: ``--engine-only`` (the engine stepped directly, no HTTP), then
``dsa-runtime serve --no-engine-process`` (the engine on a thread of the server process), then ``serve
--engine-process`` (the default on one CUDA device). The
first level warms kernel caches and is left out of the table. Prints engine steps/s and tokens/s per level with
each server's ratio to the engine alone, and writes the JSON files plus ``serve_vs_engine.json``. ``--servers``
picks the server runs, ``--client openai`` streams them with the official client, from one client process per
16 clients (``--client-processes``: one Python process streaming 64 clients with the official client is itself
the limit). Then, per server and level,
the front-end targets: tokens/s at least 0.9x the engine alone's, the inter-chunk gap p99 at most 3x the
engine's step time (one over its steps/s at that level), TTFT p99 at most 2x the engine alone's.
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
from load_clients import processes_arg  # noqa: E402
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
        return _load(["--url", url, "--client", args.client, "--client-processes", str(args.client_processes)], out, args)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[64, 1, 8, 32, 64],
                    help="client counts, in order; the first level is a warm-up left out of the table")
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--start-timeout", type=float, default=600.0, help="seconds a server may take to start")
    ap.add_argument("--out-dir", type=Path, default=HERE / "results")
    ap.add_argument("--client", choices=("httpx", "openai"), default="httpx", help="how the servers are streamed")
    ap.add_argument("--client-processes", type=processes_arg, default="auto", metavar="N|auto",
                    help="client processes per level against the servers (bench/serve_load.py; auto: one per 16 "
                         "clients, at most half the cores)")
    ap.add_argument("--servers", nargs="+", choices=("thread", "process"), default=["thread", "process"],
                    help="server runs: the engine on a thread of the server (--no-engine-process), in its own process")
    args = ap.parse_args()
    runs = {"engine": _load(["--engine-only"], args.out_dir / "serve_vs_engine_engine.json", args)}
    for name in args.servers:
        runs[name] = _served(name == "process", args.out_dir / f"serve_vs_engine_{name}.json", args)
    servers = list(args.servers)
    rows = []
    for i, level in enumerate(runs["engine"]["levels"]):
        if i == 0:
            continue  # warm-up
        row = {"clients": level["concurrency"]}
        for name, run in runs.items():
            lv = run["levels"][i]
            row[name] = {"steps_per_s": lv["engine_steps_per_s"], "tokens_per_s": lv["throughput_tok_s"],
                         "ttft_p50_s": lv["ttft_s"]["p50"], "ttft_p99_s": lv["ttft_s"]["p99"],
                         "itl_p99_s": lv["itl_s"]["p99"]}
        rows.append(row)
    names = {"thread": "server, thread", "process": "server, --engine-process"}
    print("\n| clients | engine alone steps/s | tok/s | "
          + " | ".join(f"{names[n]} steps/s (ratio) | tok/s" for n in servers) + " |")
    print("|---:|---:|---:|" + "---:|---:|" * len(servers))
    for r in rows:
        base = r["engine"]["steps_per_s"]
        cells = [f"{r['clients']}", f"{base:.0f}", f"{r['engine']['tokens_per_s']:,.0f}"]
        for name in servers:
            steps = r[name]["steps_per_s"]
            ratio = f"{steps / base:.2f}" if steps is not None and base else "n/a"
            cells += [f"{steps:.0f} ({ratio})" if steps is not None else "n/a", f"{r[name]['tokens_per_s']:,.0f}"]
        print("| " + " | ".join(cells) + " |")
    _print_targets(rows, servers)
    summary = args.out_dir / "serve_vs_engine.json"
    summary.write_text(json.dumps({"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                   "settings": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2))
    print(f"wrote {summary}")
    return 0


def _print_targets(rows: list[dict[str, Any]], servers: list[str]) -> None:
    """Each server level against the front-end targets (module docstring), with the engine alone's figures."""
    print("\n| server | clients | tok/s vs engine (>= 0.9) | gap p99 / engine step (<= 3) | TTFT p99 vs engine "
          "(<= 2) |")
    print("|---|---:|---:|---:|---:|")
    for name in servers:
        for r in rows:
            eng, srv = r["engine"], r[name]
            tok = srv["tokens_per_s"] / eng["tokens_per_s"]
            step_s = 1.0 / eng["steps_per_s"]
            gap = srv["itl_p99_s"] / step_s
            ttft = srv["ttft_p99_s"] / eng["ttft_p99_s"]
            marks = ["ok" if ok else "MISS" for ok in (tok >= 0.9, gap <= 3.0, ttft <= 2.0)]
            print(f"| {name} | {r['clients']} | {tok:.2f} {marks[0]} | {gap:.1f} ({1e3 * srv['itl_p99_s']:.2f} / "
                  f"{1e3 * step_s:.2f} ms) {marks[1]} | {ttft:.2f} ({1e3 * srv['ttft_p99_s']:.1f} / "
                  f"{1e3 * eng['ttft_p99_s']:.1f} ms) {marks[2]} |")


if __name__ == "__main__":
    sys.exit(main())
