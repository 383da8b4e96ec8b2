"""Front-end capacity: how many tokens/s ``serve`` delivers when the engine is never the limit.

    python bench/frontend_capacity.py                                  # 1, 64 and 128 clients, httpx
    python bench/frontend_capacity.py --client openai --clients 1 64   # the official client
    python bench/frontend_capacity.py --clients 64 --profile bench/results/frontend.prof

``serve``'s own code (``dsa_runtime.server.launch.serve``) runs in a subprocess in front of
``bench/fake_engine.py``'s engine, which emits one token per running request every ``--step-ms`` (an H100
step of the embedded model is about 1 ms) without model work, in an engine process of its own as on a GPU
(``--no-engine-process``: on the server's engine thread). Each of N clients streams chat requests back to
back (``--max-tokens`` each). Per level it reports delivered tokens/s (from the usage chunks) against what
the engine emits at that batch (N tokens a step), the server process's CPU seconds per 1,000 delivered
tokens (all its threads; the engine process not included) and the cores the server, the engine process and
the clients used, the gap between a request's content chunks
(p50 / p99) with the mean tokens a chunk carries, and TTFT (p50 / p99). ``--profile PATH`` runs the server
under cProfile (its event-loop thread) and prints the top functions by own time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from load_clients import Load, level_processes, processes_arg, run_clients  # noqa: E402

MODEL = "tiny-chat"  # the name the fake engine's server answers to


# --- the server side (a subprocess) --------------------------------------------------------------------------
def _serve(args: argparse.Namespace) -> int:
    from fake_engine import FakeEngine, FakeEngineConfig

    from dsa_runtime.server.config import ServerConfig
    from dsa_runtime.server.launch import serve

    fake = FakeEngineConfig(step_ms=args.step_ms, max_running=max(args.clients))
    if args.engine_process:
        from dsa_runtime.engine.engine_process import EngineProcess

        engine: Any = EngineProcess(fake, build=FakeEngine)
    else:
        engine = FakeEngine(fake)
    config = ServerConfig(port=args.serve, drain_timeout=2.0, engine_process=args.engine_process)
    if args.profile is None:
        return serve(config, engine)
    import cProfile

    profiler = cProfile.Profile()
    try:
        return profiler.runcall(serve, config, engine)
    finally:
        profiler.dump_stats(args.profile)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [sys.executable, __file__, "--serve", str(port), "--step-ms", str(args.step_ms),
           "--clients", *map(str, args.clients), "--engine-process" if args.engine_process else "--no-engine-process"]
    if args.profile is not None:
        cmd += ["--profile", str(args.profile)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120.0
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited during start-up (code {proc.returncode})")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the server was not healthy within 120 s")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.3)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, all its threads (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- the client side (bench/load_clients.py) ------------------------------------------------------------------
def _pick(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _measure(url: str, pid: int, clients: int, args: argparse.Namespace) -> dict[str, Any]:
    engine_pids = _children(pid)  # the engine process (none with --no-engine-process)
    engine0 = sum(_cpu_seconds(p) for p in engine_pids)
    cpu0 = _cpu_seconds(pid)
    load = Load(url, MODEL, args.max_tokens, None, args.client)
    run = run_clients(load, clients, clients * args.requests_per_client, level_processes(args.client_processes, clients))
    wall, cpu = run.wall_s, _cpu_seconds(pid) - cpu0
    engine_cpu = sum(_cpu_seconds(p) for p in engine_pids) - engine0
    records = run.results
    tokens = sum(r["tokens"] for r in records)
    chunks = sum(r["chunks"] for r in records)
    gaps = [g for r in records for g in r["itl"]]
    ttft = [r["ttft"] for r in records if r["chunks"]]
    emitted = min(clients, max(args.clients)) * 1000.0 / args.step_ms
    return {
        "clients": clients, "client_processes": run.processes, "requests": len(records), "tokens": tokens,
        "wall_s": wall, "tokens_per_s": tokens / wall, "engine_tokens_per_s": emitted,
        "server_cpu_ms_per_1k_tokens": 1e6 * cpu / max(tokens, 1), "server_cpu_util": cpu / wall,
        "engine_cpu_util": engine_cpu / wall, "client_cpu_util": run.cpu_s / wall,
        "client_cpu_ms_per_1k_tokens": 1e6 * run.cpu_s / max(tokens, 1),
        "tokens_per_chunk": tokens / max(chunks, 1),
        "gap_ms": {"p50": 1e3 * _pick(gaps, 0.5), "p99": 1e3 * _pick(gaps, 0.99)},
        "ttft_ms": {"p50": 1e3 * _pick(ttft, 0.5), "p99": 1e3 * _pick(ttft, 0.99)},
    }


def _print_profile(path: Path, top: int) -> None:
    import pstats

    stats = pstats.Stats(str(path))
    print(f"\ncProfile of the server's event loop thread ({path}), top {top} by own time:")
    stats.sort_stats("tottime").print_stats(top)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 64, 128], help="client counts, in order")
    ap.add_argument("--step-ms", type=float, default=1.0, help="the fake engine's step time")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--client", choices=("httpx", "openai"), default="httpx")
    ap.add_argument("--client-processes", type=processes_arg, default="auto", metavar="N|auto",
                    help="client processes per level (auto: one per 16 clients, at most half the cores)")
    ap.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=True,
                    help="the fake engine in a process of its own (as serve runs on one GPU)")
    ap.add_argument("--warmup", type=int, default=8, help="clients of an unreported first level (0: none)")
    ap.add_argument("--profile", type=Path, default=None, help="cProfile the server; write its stats here")
    ap.add_argument("--out", type=Path, default=None, help="write the levels as JSON here")
    ap.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)  # the server subprocess's port
    args = ap.parse_args()
    if args.serve is not None:
        return _serve(args)
    proc, url = _start_server(args)
    try:
        if args.warmup:
            _measure(url, proc.pid, args.warmup, args)
        levels = []
        for clients in args.clients:
            levels.append(_measure(url, proc.pid, clients, args))
            lv = levels[-1]
            print(f"clients {clients:4d}: {lv['tokens_per_s']:9,.0f} tok/s ({lv['tokens_per_s'] / lv['engine_tokens_per_s']:.2f}x "
                  f"the engine's {lv['engine_tokens_per_s']:,.0f}), server CPU {lv['server_cpu_ms_per_1k_tokens']:.1f} ms"
                  f"/1k tok ({lv['server_cpu_util']:.2f} cores; engine {lv['engine_cpu_util']:.2f}, clients "
                  f"{lv['client_cpu_util']:.2f} in {lv['client_processes']} process(es), "
                  f"{lv['client_cpu_ms_per_1k_tokens']:.1f} ms/1k tok), {lv['tokens_per_chunk']:.2f} tok/chunk, gap p50/p99 "
                  f"{lv['gap_ms']['p50']:.2f}/{lv['gap_ms']['p99']:.2f} ms, TTFT p50/p99 {lv['ttft_ms']['p50']:.1f}/"
                  f"{lv['ttft_ms']['p99']:.1f} ms", flush=True)
    finally:
        proc.terminate()
        proc.wait(60)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                        "settings": {k: str(v) for k, v in vars(args).items()}, "levels": levels},
                                       indent=2))
    if args.profile is not None:
        _print_profile(args.profile, 30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
