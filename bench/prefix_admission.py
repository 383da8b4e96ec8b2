"""Admission cost of requests that share a cached prefix: the time from adding B requests to their first
tokens, with the prefix cache and without it, straight through the engine (no HTTP).

    python bench/prefix_admission.py                      # embedded model; 2,000 shared + 50 own tokens; B 1 8 32
    python bench/prefix_admission.py --prefix 8000 --tail 200 --batch 1 4 16 --repeats 5

Every request is the shared prefix followed by its own random tail (token ids drawn from the vocabulary),
``max_tokens=1``. With the cache, one request first fills it; each timed round then adds B requests at once
and steps until all have their token, so the figure is what a burst of B new requests costs the engine. The
first round of each batch size is a warm-up (kernel compiles, graph buckets) and is not reported; a Triton
kernel compiled during the timed rounds is listed by name (a new variant mid-serving is a stall a user sees).
Prints a table and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_json  # noqa: E402


def _compile_log() -> list[str]:
    """Names of the Triton kernels compiled from now on (a list that stays empty without Triton)."""
    from dsa_runtime.engine.compile_log import watch_compiles

    log: list[str] = []
    watch_compiles(lambda name, _variant: log.append(name))
    return log


def _round(engine: Any, prompts: list[list[int]], tag: str) -> float:
    from dsa_runtime.engine import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", prompt, params)
    while engine.has_unfinished():
        engine.step()
    return time.perf_counter() - start


def measure(args: argparse.Namespace, cache: bool, compiled: list[str]) -> dict[str, Any]:
    import torch

    from dsa_runtime.engine import Engine, EngineConfig

    # Never fewer running requests than the default: the largest decode graph follows it, and the tails run as
    # graph rows only when they fit it.
    running = max(EngineConfig().max_running_requests, max(args.batch))
    engine = Engine(EngineConfig(model=args.model_dir, dtype=args.dtype, max_running_requests=running,
                                 disable_radix_cache=not cache))
    vocab = engine.model_config.vocab_size
    rng = random.Random(0)
    prefix = [rng.randrange(10, vocab) for _ in range(args.prefix)]

    def prompts(n: int) -> list[list[int]]:
        return [prefix + [rng.randrange(10, vocab) for _ in range(args.tail)] for _ in range(n)]

    if cache:
        _round(engine, prompts(1), "fill")
    rows = []
    for b in args.batch:
        _round(engine, prompts(b), f"warm{b}")
        before = len(compiled)
        times = [_round(engine, prompts(b), f"b{b}r{r}") for r in range(args.repeats)]
        rows.append({"batch": b, "median_s": statistics.median(times), "min_s": min(times), "times_s": times,
                     "compiled": compiled[before:]})
        print(f"  {'cache' if cache else 'no cache'}: {b} requests done", file=sys.stderr, flush=True)
    stats = engine.stats()
    rows_hit = stats.prefix_cache_hits_total / stats.prefix_cache_queries_total if stats.prefix_cache_queries_total else 0
    del engine
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"cache": cache, "hit_rate": rows_hit, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default=None, help="checkpoint (default: the embedded model)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--prefix", type=int, default=2000, help="shared prefix tokens")
    parser.add_argument("--tail", type=int, default=50, help="each request's own tokens after the prefix")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32], help="requests added at once")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per batch size")
    parser.add_argument("--out", type=Path, default=Path("bench/results/prefix_admission.json"))
    args = parser.parse_args(argv)
    if args.prefix < 1 or args.tail < 1 or args.repeats < 1 or min(args.batch) < 1:
        parser.error("--prefix, --tail, --repeats and --batch must be >= 1")
    compiled = _compile_log()
    runs = [measure(args, True, compiled), measure(args, False, compiled)]
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    print(f"\n{device}: {args.prefix} shared + {args.tail} own tokens per request; time from adding B requests to "
          f"their first tokens (median of {args.repeats}); hit rate {runs[0]['hit_rate']:.2f}")
    print("| requests at once | cache | no cache | speed-up | Triton compiles in timed rounds |\n|---:|---:|---:|---:|---|")
    for on, off in zip(runs[0]["rows"], runs[1]["rows"], strict=True):
        new = sorted(set(on["compiled"] + off["compiled"]))
        print(f"| {on['batch']} | {on['median_s'] * 1e3:.1f} ms | {off['median_s'] * 1e3:.1f} ms | "
              f"{off['median_s'] / on['median_s']:.1f}x | {', '.join(new) or 'none'} |")
    payload = {"device": device, "host": platform.node(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "torch": torch.__version__, "prefix": args.prefix, "tail": args.tail, "runs": runs}
    write_json(args.out, payload)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
