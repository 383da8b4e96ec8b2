"""Serving load test: throughput, time to first token and inter-token latency at several concurrencies.

    python bench/serve_load.py                          # embedded model, in-process server, 1/8/32 clients
    python bench/serve_load.py --url http://127.0.0.1:30000 --model NAME --concurrency 1 8 32 64
    python bench/serve_load.py --engine-only --concurrency 1 8 32 64   # the same load, no HTTP: the baseline
    python bench/serve_load.py --url http://127.0.0.1:30000 --client openai   # streamed by the official client
    python bench/serve_load.py --shared-prefix 2000 --compare-radix-cache --concurrency 8 32   # prefix caching
    python bench/serve_load.py --shared-prefix 2000 --compare-radix-cache --engine-only --warmup 1 --concurrency 8

Each client sends streaming chat requests back to back (``max_tokens`` tokens each, EOS ignored, greedy)
until the level's request count is done. TTFT is request start to the first content chunk; ITL is the gap
between content chunks divided by the tokens they carry (one per chunk on this server); throughput is
generated tokens (from the usage chunk) over the level's wall time. Prints a table and writes JSON
(``--out``, written to a temporary file then renamed).

``--engine-only`` drives an :class:`Engine` directly with the same load (the same chat prompts, rendered and
tokenised as the server does, the same closed loop of clients): the step rate the server should reach.

``--shared-prefix N`` starts every request with the same system prompt of about N tokens (sized with the
in-process server's tokenizer), and the level reports the prefix cache's hit rate from ``/metrics``;
``--compare-radix-cache`` runs the levels on an in-process server with the cache, then on one without it, and
prints the TTFT ratios (with ``--serve-process`` on ``dsa-runtime serve`` subprocesses, with ``--engine-only``
on two engines). ``--warmup N`` first runs every level once, unreported, with N requests per client.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_json  # noqa: E402
from load_clients import Load, level_processes, processes_arg, prompt, run_clients  # noqa: E402


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p90": float("nan"), "p99": float("nan"), "mean": float("nan")}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "mean": statistics.fmean(ordered)}


def shared_prefix_text(tokens: int, encode: Any = None) -> str:
    """A system prompt of about ``tokens`` tokens (exactly sized with ``encode``, else ~4 characters a token)."""
    words = [f"rule {i}: answer plainly and keep to the facts." for i in range(100_000)]
    if encode is None:
        text, i = "", 0
        while len(text) < 4 * tokens:
            text += words[i] + " "
            i += 1
        return text
    lo, hi = 1, max(2, tokens)  # words needed: binary search on the encoded length
    while lo < hi:
        mid = (lo + hi) // 2
        if len(encode(" ".join(words[:mid]))) >= tokens:
            hi = mid
        else:
            lo = mid + 1
    return " ".join(words[:lo])


_COUNTERS = ("dsa:engine_steps_total", "dsa:prefix_cache_queries_total", "dsa:prefix_cache_hits_total")


def _counters(url: str) -> dict[str, float]:
    """The engine counters of the server's /metrics that it has (none for a server without metrics)."""
    import httpx

    try:
        text = httpx.get(url + "/metrics", timeout=60).text
    except Exception:  # noqa: BLE001 - a server without metrics: no step rate, no hit rate
        return {}
    out = {}
    for line in text.splitlines():
        name = line.split(" ", 1)[0].split("{", 1)[0]
        if name in _COUNTERS:
            out[name] = float(line.rsplit(" ", 1)[1])
    return out


def run_level(url: str, model: str, concurrency: int, requests: int, max_tokens: int,
              system: str | None = None, client_kind: str = "httpx", processes: int = 1) -> dict[str, Any]:
    """One level: ``concurrency`` clients stream ``requests`` chat requests in all, with raw ``httpx`` SSE
    parsing or (``client_kind="openai"``) the official ``openai`` client, from ``processes`` client processes
    (:mod:`load_clients`)."""
    before = _counters(url)
    run = run_clients(Load(url, model, max_tokens, system, client_kind), concurrency, requests, processes)
    results, wall = run.results, run.wall_s
    after = _counters(url)
    delta = {k: after[k] - before[k] for k in after if k in before}
    tokens = sum(r["tokens"] for r in results)
    queries = delta.get("dsa:prefix_cache_queries_total")
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "max_tokens": max_tokens,
        "client_processes": run.processes,
        "wall_s": wall,
        "output_tokens": tokens,
        "throughput_tok_s": tokens / wall,
        # The engine's steps per second during the level (from /metrics; None when the server has no such gauge).
        "engine_steps_per_s": delta["dsa:engine_steps_total"] / wall if "dsa:engine_steps_total" in delta else None,
        # Prompt tokens found in the prefix cache over those looked up during the level (None: no such metrics).
        "prefix_cache_hit_rate": delta["dsa:prefix_cache_hits_total"] / queries if queries else None,
        "requests_per_s": len(results) / wall,
        "ttft_s": _percentiles([r["ttft"] for r in results]),
        "itl_s": _percentiles([g for r in results for g in r["itl"]]),
        "e2e_s": _percentiles([r["e2e"] for r in results]),
    }


def _max_running(args: argparse.Namespace) -> int:
    """``--max-running-requests`` of the engines here: the default, or the largest level when that is more.
    Never fewer: the largest decode graph follows it, and a smaller one would send short prefill chunks
    (a question after a cached prefix) through the eager path a default server does not take."""
    from dsa_runtime.engine import EngineConfig

    return max(EngineConfig().max_running_requests, max(args.concurrency))


def run_engine_level(engine: Any, encode: Any, concurrency: int, requests: int, max_tokens: int) -> dict[str, Any]:
    """The load of :func:`run_level` without HTTP: ``concurrency`` requests in flight, the next added as soon as
    one finishes; times are taken when ``Engine.step`` returns the outputs."""
    from dsa_runtime.engine import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    live: dict[str, dict[str, Any]] = {}
    results: list[dict[str, Any]] = []
    before = engine.stats()
    steps0 = before.steps_total
    start = time.perf_counter()
    added = 0
    while added < requests or engine.has_unfinished():
        while len(live) < concurrency and added < requests:
            rid = f"e{concurrency}-{added}"
            engine.add_request(rid, encode(prompt(added)), params)
            live[rid] = {"start": time.perf_counter(), "first": None, "last": 0.0, "itl": []}
            added += 1
        for out in engine.step():
            now = time.perf_counter()
            rec = live[out.request_id]
            if out.new_text:
                if rec["first"] is None:
                    rec["first"] = now
                else:
                    rec["itl"].append(now - rec["last"])
                rec["last"] = now
            if out.finished:
                del live[out.request_id]
                results.append({"ttft": (rec["first"] or now) - rec["start"], "itl": rec["itl"],
                                "e2e": now - rec["start"], "tokens": len(out.token_ids)})
    wall = time.perf_counter() - start
    after = engine.stats()
    tokens = sum(r["tokens"] for r in results)
    queries = after.prefix_cache_queries_total - before.prefix_cache_queries_total
    return {
        "concurrency": concurrency, "requests": len(results), "max_tokens": max_tokens, "wall_s": wall,
        "output_tokens": tokens, "throughput_tok_s": tokens / wall,
        "engine_steps_per_s": (after.steps_total - steps0) / wall,
        "prefix_cache_hit_rate": (after.prefix_cache_hits_total - before.prefix_cache_hits_total) / queries
        if queries else None,
        "requests_per_s": len(results) / wall,
        "ttft_s": _percentiles([r["ttft"] for r in results]),
        "itl_s": _percentiles([g for r in results for g in r["itl"]]),
        "e2e_s": _percentiles([r["e2e"] for r in results]),
    }


def _engine_only(args: argparse.Namespace) -> tuple[str, list[dict[str, Any]]]:
    """Every level of ``--concurrency`` straight through an engine; prompts as the server renders them."""
    from dsa_runtime.engine import Engine, EngineConfig
    from dsa_runtime.server.config import detect_flavor
    from dsa_runtime.server.prompting import PromptBuilder

    engine_config = EngineConfig(model=args.model_dir, dtype=args.dtype, max_running_requests=_max_running(args),
                                 disable_radix_cache=args.disable_radix_cache)
    engine = Engine(engine_config)
    path = engine.model_path
    prompts = PromptBuilder(detect_flavor(engine.model_config, str(path or "")), engine.tokenizer,
                            str(path) if path else None)

    system = shared_prefix_text(args.shared_prefix, prompts.encode) if args.shared_prefix else None

    def encode(text: str) -> list[int]:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        return prompts.encode(prompts.render(messages, tools=None, thinking=False))

    for c in args.concurrency if args.warmup else ():
        run_engine_level(engine, encode, c, c * args.warmup, args.max_tokens)
    if args.warmup:
        print("  warm-up done", file=sys.stderr, flush=True)
    levels = []
    for c in args.concurrency:
        levels.append(run_engine_level(engine, encode, c, c * args.requests_per_client, args.max_tokens))
        print(f"  {c} clients done", file=sys.stderr, flush=True)
    del engine
    _release_device_memory()  # --compare-radix-cache builds a second engine, sized by the memory planner
    return Path(str(path or "engine")).name, levels


def _release_device_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _start_embedded(args: argparse.Namespace) -> tuple[str, str, Any]:
    """An in-process server on the embedded (or --model) checkpoint, on a free loopback port."""
    from dsa_runtime.engine import Engine, EngineConfig
    from dsa_runtime.server.app import build_app
    from dsa_runtime.server.config import ServerConfig
    from dsa_runtime.server.launch import bind_socket, build_state, make_uvicorn_server

    engine_config = EngineConfig(model=args.model_dir, dtype=args.dtype, max_running_requests=_max_running(args),
                                 disable_radix_cache=args.disable_radix_cache)
    engine = Engine(engine_config)
    state = build_state(ServerConfig(port=0, engine=engine_config), engine)
    if args.shared_prefix:
        args.system = shared_prefix_text(args.shared_prefix, lambda t: state.prompts.encode(t))
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = make_uvicorn_server(build_app(state), "127.0.0.1", port, 5.0, engine=state.engine)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.02)

    def stop() -> None:
        server.should_exit = True
        thread.join(30)

    return f"http://127.0.0.1:{port}", state.model_name, stop


def _table(levels: list[dict[str, Any]]) -> str:
    head = (f"{'clients':>7} {'reqs':>5} {'tok/s':>9} {'req/s':>7} {'TTFT p50':>9} {'TTFT p99':>9} "
            f"{'ITL p50':>8} {'ITL p90':>8} {'ITL p99':>8} {'E2E p50':>8} {'steps/s':>8}")
    rows = [head, "-" * len(head)]
    for lv in levels:
        ms = 1000.0
        rows.append(
            f"{lv['concurrency']:>7} {lv['requests']:>5} {lv['throughput_tok_s']:>9.1f} {lv['requests_per_s']:>7.2f} "
            f"{lv['ttft_s']['p50'] * ms:>7.1f}ms {lv['ttft_s']['p99'] * ms:>7.1f}ms "
            f"{lv['itl_s']['p50'] * ms:>6.1f}ms {lv['itl_s']['p90'] * ms:>6.1f}ms {lv['itl_s']['p99'] * ms:>6.1f}ms "
            f"{lv['e2e_s']['p50']:>7.2f}s"
            + (f" {lv['engine_steps_per_s']:>8.0f}" if lv.get("engine_steps_per_s") is not None else "")
            + (f" hit {lv['prefix_cache_hit_rate']:.2f}" if lv.get("prefix_cache_hit_rate") is not None else "")
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="an already running server (default: start one in-process)")
    parser.add_argument("--model", help="model name to request (with --url; default: the server's first model)")
    parser.add_argument("--model-dir", help="checkpoint for the in-process server (default: the embedded model)")
    parser.add_argument("--dtype", default="bfloat16", help="in-process engine dtype")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests-per-client", type=int, default=4, help="requests per client at each level")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--client", choices=("httpx", "openai"), default="httpx",
                        help="stream with raw httpx SSE parsing or the official openai client")
    parser.add_argument("--client-processes", type=processes_arg, default=1, metavar="N|auto",
                        help="spread each level's clients over N processes (auto: one per 16 clients, at most half "
                             "the cores), so that one Python process's CPU does not cap what is measured")
    parser.add_argument("--out", type=Path, default=Path("bench/results/serve_load.json"))
    parser.add_argument("--shared-prefix", type=int, default=0, metavar="TOKENS",
                        help="every request starts with the same system prompt of about this many tokens")
    parser.add_argument("--disable-radix-cache", action="store_true",
                        help="in-process server without the prefix cache (compare TTFT with and without it)")
    parser.add_argument("--compare-radix-cache", action="store_true",
                        help="run the levels on an in-process server with the prefix cache, then without it")
    parser.add_argument("--serve-process", action="store_true",
                        help="with --compare-radix-cache: start `dsa-runtime serve` subprocesses instead")
    parser.add_argument("--engine-only", action="store_true",
                        help="the same load straight through the engine (no server): the step rate to compare with")
    parser.add_argument("--warmup", type=int, default=0, metavar="REQUESTS",
                        help="before the levels, run every level once with this many requests per client (not "
                             "reported), so that kernel compiles of each level's shapes stay out of the figures")
    args = parser.parse_args(argv)
    from serve_load_compare import compare_radix_cache

    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if args.engine_only:
        if args.url:
            parser.error("--engine-only runs its own engine; it cannot load --url")
        if args.serve_process:
            parser.error("--engine-only starts no server; drop --serve-process")
        if args.client_processes != 1:
            parser.error("--engine-only has no clients to spread; drop --client-processes")
        if args.compare_radix_cache:
            return compare_radix_cache(args)
        model, levels = _engine_only(args)
        return _report(args, model, "engine (no HTTP)", levels)
    if args.compare_radix_cache:
        if args.url:
            parser.error("--compare-radix-cache starts its own servers; it cannot load --url")
        return compare_radix_cache(args)
    model, url, levels = _serve_levels(args)
    return _report(args, model, url, levels)


def _serve_levels(args: argparse.Namespace) -> tuple[str, str, list[dict[str, Any]]]:
    """Every level of ``--concurrency`` against ``--url`` or a fresh in-process server."""
    stop = None
    args.system = None
    if args.url:
        import httpx

        url = args.url.rstrip("/")
        model = args.model or httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
        if args.shared_prefix:
            args.system = shared_prefix_text(args.shared_prefix, _local_encoder(args))
    else:
        url, model, stop = _start_embedded(args)
    try:
        for c in args.concurrency if args.warmup else ():
            run_level(url, model, c, c * args.warmup, args.max_tokens, args.system, args.client,
                      level_processes(args.client_processes, c))
        if args.warmup:
            print("  warm-up done", file=sys.stderr, flush=True)
        levels = []
        for c in args.concurrency:
            levels.append(run_level(url, model, c, c * args.requests_per_client, args.max_tokens, args.system,
                                    args.client, level_processes(args.client_processes, c)))
            print(f"  {c} clients done", file=sys.stderr, flush=True)
    finally:
        if stop is not None:
            stop()
    return model, url, levels


def _local_encoder(args: argparse.Namespace) -> Any:
    """The served checkpoint's tokenizer when it is here (``--model-dir`` or the embedded model), to size the
    shared prefix exactly; None (about 4 characters a token) for a remote model."""
    from dsa_runtime.loader.default_model import embedded_model_path
    from dsa_runtime.loader.tokenizer import load_tokenizer

    if args.model and not args.model_dir:
        return None
    try:
        tokenizer = load_tokenizer(args.model_dir or embedded_model_path())
    except Exception:  # noqa: BLE001 - no local tokenizer: the character estimate
        return None
    return lambda text: tokenizer.encode(text, add_special_tokens=False)


def _report(args: argparse.Namespace, model: str, url: str, levels: list[dict[str, Any]]) -> int:
    shared = f"; a shared system prompt of ~{args.shared_prefix} tokens" if getattr(args, "shared_prefix", 0) else ""
    print(f"model {model} at {url}; {args.max_tokens} output tokens per request, greedy, EOS ignored{shared}")
    print(_table(levels))
    payload = {"model": model, "url": url, "host": platform.node(), "python": platform.python_version(),
               "cpu_count": os.cpu_count(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "levels": levels}
    write_json(args.out, payload)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
