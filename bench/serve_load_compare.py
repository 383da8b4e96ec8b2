"""``bench/serve_load.py --compare-radix-cache``: the same levels with the prefix cache and without it, and the
TTFT ratios (a module of its own to keep serve_load.py one concept)."""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve_load  # noqa: E402
from common import write_json  # noqa: E402


def compare_radix_cache(args: argparse.Namespace) -> int:
    """The levels with the prefix cache, then on a fresh server without it; TTFT ratios per level. With
    ``--serve-process`` each server is ``dsa-runtime serve`` in a process of its own (its default engine
    placement: the engine process on one CUDA device), with ``--engine-only`` two engines without HTTP, else
    in-process with the engine on a thread."""
    runs = {}
    for name, disabled in (("cache", False), ("no cache", True)):
        args.disable_radix_cache = disabled
        if args.engine_only:
            model, levels = serve_load._engine_only(args)
        elif args.serve_process:
            from serve_process import serve_process

            flags = ["--max-running-requests", str(serve_load._max_running(args)), "--dtype", args.dtype]
            with serve_process(flags + (["--disable-radix-cache"] if disabled else [])) as url:
                args.url = url
                model, url, levels = serve_load._serve_levels(args)
                args.url = None
        else:
            model, url, levels = serve_load._serve_levels(args)
        print(f"--- {name}")
        print(serve_load._table(levels))
        runs[name] = levels
    print(f"\n| clients | TTFT p50 cache / no cache | TTFT p99 cache / no cache | TTFT mean cache / no cache | "
          f"speed-up p50 | speed-up mean | hit rate |  (shared prefix ~{args.shared_prefix} tokens)\n"
          "|---:|---:|---:|---:|---:|---:|---:|")
    for on, off in zip(runs["cache"], runs["no cache"], strict=True):
        t_on, t_off = on["ttft_s"], off["ttft_s"]
        hit = on.get("prefix_cache_hit_rate")
        print(f"| {on['concurrency']} | {t_on['p50'] * 1e3:.0f} / {t_off['p50'] * 1e3:.0f} ms | "
              f"{t_on['p99'] * 1e3:.0f} / {t_off['p99'] * 1e3:.0f} ms | "
              f"{t_on['mean'] * 1e3:.0f} / {t_off['mean'] * 1e3:.0f} ms | {t_off['p50'] / t_on['p50']:.1f}x | "
              f"{t_off['mean'] / t_on['mean']:.1f}x | " + (f"{hit:.2f} |" if hit is not None else "n/a |"))
    where = "engine (no HTTP)" if args.engine_only else "serve process" if args.serve_process else "in-process server"
    payload = {"model": model, "host": platform.node(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "where": where, "shared_prefix_tokens": args.shared_prefix, "warmup_requests": args.warmup,
               "cache": runs["cache"], "no_cache": runs["no cache"]}
    write_json(args.out, payload)
    print(f"wrote {args.out}")
    return 0
