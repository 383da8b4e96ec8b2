"""Decode steps of a model at DeepSeek-V3.2's real dimensions on one GPU, through the runtime's tensor-only decode
path (``ModelRunner.setup`` / ``capture_graphs`` / ``run``, CUDA graphs on by default): wall ms per step, GPU kernel ms per
step (torch.profiler) and the memory roofline, at batch 1 / 16 / 64 / 128 and context 4K / 32K.

    python bench/decode_real_gpu.py [--layers 4] [--batches 1,16,64,128] [--contexts 4096,32768] [--steps 20]
        [--profile-steps 5] [--kv-layout fp8_656] [--no-graphs] [--json bench/results/decode_real_gpu.json]
    python bench/decode_real_gpu.py --dry-run    # tiny V3.2 preset on the CPU: checks this script only

Model (``decode_real_setup.real_config``): V3.2's hidden 7168, 128 heads, MLA ranks 1536 / 512, indexer 64 x 128
with top-2048, vocab 129280, 256 routed experts of 2048 (top 8) + 1 shared, cut to ``--layers`` layers (the
first ``--dense-layers`` dense, FFN 18432; the rest MoE), random FP8 weights drawn on the GPU with the released
checkpoint's names, dtypes and ue8m0 block scales, loaded by the runtime's own loader (experts stay FP8; the
other linears are dequantised to bf16 at load, as with the real checkpoint). Memory at the default 4 layers:
37.3 GiB of weights (+ ~7 GiB transient while a layer's experts are stacked) and a 12.3 GiB fp8_656 cache for
b128 x 32K (3152 B a token over 4 layers), ~50 GiB in all plus graphs; each further MoE layer adds 11.3 GiB of
weights and 3.1 GiB of that cache.

KV cache: sized for the largest (batch x context) case that fits beside the weights (``--headroom-gib`` kept
free for workspaces and graphs; a case that does not fit is reported as such), every page filled once with
random valid rows through the resolved ``kv_quant`` / ``indexer`` kernels. Request ``i`` of a case owns
consecutive pages (never page 0) and decodes at position ``context - 1`` (the indexer scores ``context`` keys,
attention reads ``min(context, 2048)`` of them). Decode is set up per context with one graph per batch size and
``max_model_len = context``: a graph's indexer logits and top-k span ``max_model_len`` (``-inf`` past a row's
length), so ``--max-model-len 163840`` shows what an engine set up for V3.2's full context pays instead.

Per case: one eager step counts the distinct experts the router picks in each MoE layer, ``--warmup`` steps,
``--steps`` timed steps synchronised one by one (wall: a step's latency, host work included), ``--steps`` more
back to back (the host launching ahead, as overlap scheduling lets it), ``--profile-steps`` under
torch.profiler (sum of CUDA kernel times per step). Roofline = bytes a step must read / the
device-to-device copy bandwidth measured in this run (``common.copy_ceiling_gbs``, read + write): every
non-expert weight as the runner holds it + lm_head + the batch's embedding rows, the distinct routed experts
(FP8 + scales), the selected MLA rows (656 B fp8_656 / 1152 B bf16) and the index-K rows (132 B x context).
Ratios: wall / kernel (1.0: the GPU never waits for the host) and roofline / wall (fraction of the memory
roofline reached). The table prints last; JSON goes to ``--json`` after every case.
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode_real_setup as S  # noqa: E402
from common import write_json  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (default 4: 1 dense + 3 MoE, ~40 GB)")
    ap.add_argument("--dense-layers", type=int, default=1, help="leading dense layers (first_k_dense_replace)")
    ap.add_argument("--batches", default="1,16,64,128")
    ap.add_argument("--contexts", default="4096,32768", help="tokens in each request's cache")
    ap.add_argument("--steps", type=int, default=20, help="timed decode steps per case")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--profile-steps", type=int, default=5)
    ap.add_argument("--kv-layout", default="fp8_656", choices=("fp8_656", "bf16"))
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--decode-backend", default="auto", help="sparse_attn.decode backend (auto: the platform's)")
    ap.add_argument("--no-graphs", action="store_true", help="eager decode (no CUDA graphs)")
    ap.add_argument("--max-model-len", type=int, default=0,
                    help="decode set up for this many tokens (graphs' indexer width) when above the context; "
                    "0: each context's own length")
    ap.add_argument("--expert-pool", type=int, default=8,
                    help="distinct random experts drawn per layer (the model still holds all 256 apart)")
    ap.add_argument("--headroom-gib", type=float, default=4.0, help="GPU memory kept free beside weights and cache")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="default bench/results/decode_real_gpu.json (_dry with --dry-run)")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny V3.2 preset on the CPU, contexts 40,100, batches 1,3, 2 steps: checks the script")
    args = ap.parse_args(argv)
    if args.dry_run:
        args.batches, args.contexts = "1,3", "40,100"
        args.steps, args.warmup, args.profile_steps = 2, 1, 1
    if args.json is None:
        args.json = str(RESULTS / ("decode_real_gpu_dry.json" if args.dry_run else "decode_real_gpu.json"))
    return args


# --- set-up -----------------------------------------------------------------------------------------------------
def copy_bandwidth_gbs(device: torch.device) -> float:
    """Device-to-device copy bandwidth, GB/s counting bytes read plus written (1 GiB on CUDA, 64 MiB on CPU)."""
    if device.type == "cuda":
        from common import copy_ceiling_gbs

        return copy_ceiling_gbs(1 << 30)
    src = torch.randint(0, 255, (64 << 20,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t0 = time.perf_counter()
    for _ in range(5):
        dst.copy_(src)
    return 2 * 5 * src.numel() / (time.perf_counter() - t0) / 1e9


def resolve(config, args: argparse.Namespace):
    """The kernels for this model (FP8 experts, 128 heads, k 2048, ``--page-size``) and ``--kv-layout``."""
    from dsa_runtime.model.runner import kernel_needs
    from dsa_runtime.resolve import KernelConfig, resolve_kernels

    kcfg = KernelConfig(platform="cpu" if args.dry_run else "auto", kv_layout=args.kv_layout,
                        sparse_attn_decode=args.decode_backend)
    return resolve_kernels(kcfg, needs=kernel_needs(config, args.page_size))


def build_runner(config, kernels, device: torch.device, args: argparse.Namespace):
    """A bf16 ModelRunner on random FP8 weights drawn on ``device``, over a 2-page placeholder cache (the real
    cache is attached once the weights' memory is known, as the engine does)."""
    from dsa_runtime.cache import KVCache
    from dsa_runtime.model.runner import ModelRunner

    tensors = S.random_fp8_state(config, device, seed=args.seed, expert_pool=None if args.dry_run else args.expert_pool)
    placeholder = KVCache(config, 2, 1, kernels.kv_layout, device, torch.bfloat16)
    runner = ModelRunner(config, tensors, kernels=kernels, cache=placeholder, dtype=torch.bfloat16, device=device)
    del tensors
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return runner


def pages_per_request(context: int, page_size: int) -> int:
    return -(-context // page_size)


def fit_cases(cases: list[tuple[int, int]], page_size: int, bytes_per_page: int,
              budget: int) -> tuple[int, dict[tuple[int, int], bool]]:
    """Which ``(batch, context)`` cases fit a cache budget, and the pages of the largest that does (at least 2).

    A case needs ``batch * ceil(context / page_size) + 1`` pages (page 0 is reserved).
    """
    need = {c: c[0] * pages_per_request(c[1], page_size) + 1 for c in cases}
    fits = {c: n * bytes_per_page <= budget for c, n in need.items()}
    return max([2] + [n for c, n in need.items() if fits[c]]), fits


def size_cache(config, cases: list[tuple[int, int]], args: argparse.Namespace,
               device: torch.device) -> tuple[int, dict[tuple[int, int], bool], dict[str, int]]:
    """:func:`fit_cases` for the free device memory less ``--headroom-gib`` (no limit on the CPU).

    Returns ``(num_pages, fits, memory)``; ``memory``: free bytes, the cache budget and bytes per page.
    """
    per_page = S.cache_bytes_per_page(config, args.page_size, args.kv_layout)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        budget = int(free - args.headroom_gib * 2**30)
    else:
        free = budget = 1 << 62
    num_pages, fits = fit_cases(cases, args.page_size, per_page, budget)
    return num_pages, fits, {"free_bytes": free, "budget_bytes": budget, "bytes_per_page": per_page}


# --- one case ---------------------------------------------------------------------------------------------------
def case_plan(runner, batch: int, context: int, vocab: int, seed: int):
    """Acquire ``batch`` slots, give request ``i`` pages ``1 + i * P .. 1 + (i + 1) * P - 1`` (written once, as an
    engine writes a request's pages as it grows); the step decodes every request at position ``context - 1`` with
    a random token. Returns (step, slot table, slots)."""
    from dsa_runtime.model.slots import SlotTable
    from dsa_runtime.model.step import Step, StepKind

    table = SlotTable(runner.max_requests, runner.max_pages)
    per = pages_per_request(context, runner.cache.page_size)
    slots = [table.acquire() for _ in range(batch)]
    runner.state.apply(table.updates([(s, list(range(1 + i * per, 1 + (i + 1) * per))) for i, s in enumerate(slots)]))
    rng = random.Random(seed)
    ids = [rng.randrange(vocab) for _ in range(batch)]
    return Step.of(StepKind.TARGET, slots, ids, [context - 1] * batch), table, slots


def count_experts(runner, plan) -> list[int]:
    """Distinct routed experts of each MoE layer in one eager step of ``plan`` (``kernels.moe.route`` watched)."""
    moe = runner.kernels.moe
    route = moe.route
    seen: list[int] = []

    def watched(*a, **kw):
        weights, ids = route(*a, **kw)
        seen.append(int(torch.unique(ids[ids >= 0]).numel()))
        return weights, ids

    graphs, runner.graphs = runner.graphs, {}
    moe.route = watched
    try:
        runner.run(plan)
    finally:
        moe.route = route
        runner.graphs = graphs
    return seen


def time_steps(runner, plan, steps: int, *, each: bool) -> float:
    """Milliseconds per decode step over ``steps`` steps, host work included: ``each`` synchronises after every
    step (a step's full latency, as an engine that reads each step's tokens before the next sees it), otherwise
    the steps run back to back (the host launches ahead, as under overlap scheduling)."""
    sync(runner.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        runner.run(plan)
        if each:
            sync(runner.device)
    sync(runner.device)
    return (time.perf_counter() - t0) * 1e3 / steps


def kernel_ms(prof) -> float:
    """Total CUDA kernel time of a profile, ms (memcpy / memset included), as ``bench/engine_gpu.py`` sums it."""
    total_us = 0.0
    for evt in prof.events():
        if getattr(evt, "device_type", None) is not None and str(evt.device_type).endswith("CUDA"):
            total_us += evt.device_time
    return total_us / 1e3


def kernel_ms_per_step(runner, plan, steps: int) -> float | None:
    """Sum of CUDA kernel times per step under torch.profiler (None on CPU: the profiler runs, nothing to sum)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = runner.device.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            runner.run(plan)
        sync(runner.device)
    return kernel_ms(prof) / steps if cuda else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def run_case(runner, weights: dict, batch: int, context: int, bw_gbs: float, args: argparse.Namespace) -> dict:
    """Time one (batch, context) case; see the module docstring. Returns its JSON row."""
    config = runner.config
    plan, table, slots = case_plan(runner, batch, context, config.vocab_size, args.seed + batch)
    try:
        measured = count_experts(runner, plan)
        moe_layers = len(weights["expert"])
        uniform = S.uniform_distinct_experts(config.n_routed_experts, config.num_experts_per_tok, batch)
        distinct = [float(d) for d in measured] if len(measured) == moe_layers else [uniform] * moe_layers
        for _ in range(args.warmup):
            runner.run(plan)
        wall = time_steps(runner, plan, args.steps, each=True)
        back_to_back = time_steps(runner, plan, args.steps, each=False)
        gpu = kernel_ms_per_step(runner, plan, args.profile_steps)
        finite = bool(torch.isfinite(runner.run(plan)).all())
    finally:
        for s in slots:
            table.release(s)
    need = S.step_bytes(config, weights, batch, context, runner.cache.kv_layout, distinct)
    roof = need["total"] / bw_gbs / 1e6
    return {
        "case": case_name(batch, context), "batch": batch, "context": context, "fits": True,
        "graphs": bool(runner.graphs), "wall_ms": wall, "back_to_back_ms": back_to_back, "kernel_ms": gpu,
        "wall_over_kernel": _ratio(wall, gpu), "roofline_ms": roof, "roofline_over_wall": roof / wall,
        "kernel_roofline_fraction": _ratio(roof, gpu), "tokens_per_s": batch * 1e3 / wall,
        "distinct_experts": measured, "distinct_experts_uniform": uniform, "bytes": need, "finite": finite,
        "kv_pages": batch * pages_per_request(context, runner.cache.page_size),
        "kv_cache_bytes": batch * pages_per_request(context, runner.cache.page_size)
        * S.cache_bytes_per_page(config, runner.cache.page_size, runner.cache.kv_layout),
    }


def case_name(batch: int, context: int) -> str:
    ctx = f"{context // 1024}K" if context % 1024 == 0 else str(context)
    return f"b{batch} ctx{ctx}"


# --- per context ------------------------------------------------------------------------------------------------
def setup_context(runner, batches: list[int], context: int, graphs: bool, max_model_len: int = 0) -> dict:
    """Request slots for ``max(batches)`` and ``max(context, max_model_len)`` tokens; with ``graphs`` one CUDA
    graph per batch (on CUDA). Returns capture facts (seconds, bytes, whether graphs are on)."""
    runner.graphs = {}
    gc.collect()
    if runner.device.type == "cuda":
        torch.cuda.empty_cache()
    t0 = time.perf_counter()
    width = max(context, max_model_len)
    runner.setup(max(batches), width)
    runner.capture_graphs(sorted(batches) if graphs else None, progress=False)
    g = runner.graphs
    return {"context": context, "max_model_len": width, "graphs": bool(g), "setup_s": time.perf_counter() - t0,
            "capture_bytes": sum(x.capture_bytes for x in g.values())}


def run_all(runner, cases: list[tuple[int, int]], fits: dict, weights: dict, bw: float, args, out: dict) -> None:
    """Every case, context by context; rows appended to ``out["rows"]`` and the JSON rewritten after each."""
    rows = out["rows"]
    for context in sorted({c for _, c in cases}):
        batches = [b for b, c in cases if c == context and fits[(b, c)]]
        for b, c in cases:
            if c == context and not fits[(b, c)]:
                rows.append({"case": case_name(b, c), "batch": b, "context": c, "fits": False,
                             "kv_bytes": (b * pages_per_request(c, args.page_size) + 1) * out["memory"]["bytes_per_page"]})
                log(f"{case_name(b, c)}: does not fit")
        if not batches:
            continue
        info = setup_context(runner, batches, context, not args.no_graphs, args.max_model_len)
        out["setups"].append(info)
        log(f"context {context}: decode set up in {info['setup_s']:.1f} s (graphs {'on' if info['graphs'] else 'off'}"
            + (f", {info['capture_bytes'] / 2**20:.0f} MiB" if info["graphs"] else "") + ")")
        if not args.no_graphs and not info["graphs"] and runner.device.type == "cuda":
            log("WARNING: CUDA-graph capture failed (see the log above); this context runs eagerly")
        for batch in batches:
            row = run_case(runner, weights, batch, context, bw, args)
            rows.append(row)
            kern = f"{row['kernel_ms']:.3f}" if row["kernel_ms"] is not None else "-"
            log(f"{row['case']}: {row['wall_ms']:.3f} ms wall, {kern} ms kernels, roofline {row['roofline_ms']:.3f} ms "
                f"({row['roofline_over_wall']:.2f} of it), experts {row['distinct_experts']}, finite {row['finite']}")
            write_json(args.json, out)


def print_table(out: dict) -> None:
    s = out["settings"]
    print(f"\n{out['device']}: {out['model']['layers']} layers ({out['model']['dense_layers']} dense), "
          f"weights {out['model']['weight_bytes'] / 1e9:.1f} GB, KV {s['kv_layout']} page {s['page_size']}, "
          f"graphs {'on' if any(x['graphs'] for x in out['setups']) else 'off'}, copy {out['copy_gbs']:.0f} GB/s, decode "
          f"{out['kernels'].get('sparse_attn.decode')}, moe {out['kernels'].get('moe.experts')}")
    print("| case | wall ms/step | back-to-back ms | kernel ms/step | wall/kernel | roofline ms | roofline/wall | tok/s "
          "| experts/layer |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in out["rows"]:
        if not r["fits"]:
            print(f"| {r['case']} | does not fit ({r['kv_bytes'] / 2**30:.1f} GiB KV) | | | | | | | |")
            continue
        kern = f"{r['kernel_ms']:.3f}" if r["kernel_ms"] is not None else "-"
        ratio = f"{r['wall_over_kernel']:.2f}" if r["wall_over_kernel"] is not None else "-"
        experts = sum(r["distinct_experts"]) / max(len(r["distinct_experts"]), 1)
        print(f"| {r['case']} | {r['wall_ms']:.3f} | {r['back_to_back_ms']:.3f} | {kern} | {ratio} | {r['roofline_ms']:.3f} | "
              f"{r['roofline_over_wall']:.2f} | {r['tokens_per_s']:.0f} | {experts:.1f} |")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("decode_real_gpu: needs a CUDA device (or --dry-run)", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.dry_run else "cuda")
    config = S.dry_config() if args.dry_run else S.real_config(args.layers, args.dense_layers)
    cases = [(int(b), int(c)) for c in args.contexts.split(",") for b in args.batches.split(",")]
    bw = copy_bandwidth_gbs(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)"
    log(f"{name}: copy {bw:.0f} GB/s")
    kernels = resolve(config, args)
    t0 = time.perf_counter()
    runner = build_runner(config, kernels, device, args)
    weights = S.weight_bytes(runner.model)
    log(f"model built in {time.perf_counter() - t0:.1f} s: {config.num_hidden_layers} layers, "
        f"{weights['total'] / 1e9:.2f} GB of weights")
    num_pages, fits, memory = size_cache(config, cases, args, device)
    from dsa_runtime.cache import KVCache

    t0 = time.perf_counter()
    runner.cache = KVCache(config, num_pages, args.page_size, kernels.kv_layout, device, torch.bfloat16)
    S.fill_cache(runner.cache, kernels, config, seed=args.seed + 1)
    sync(device)
    log(f"KV cache: {num_pages} pages ({runner.cache.total_bytes / 2**30:.2f} GiB) filled in "
        f"{time.perf_counter() - t0:.1f} s")
    out: dict[str, Any] = {
        "bench": "decode_real_gpu", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": name,
        "torch": torch.__version__, "python": platform.python_version(), "settings": vars(args),
        "copy_gbs": bw, "kernels": {m: c.backend for m, c in kernels.choices.items()},
        "model": {"layers": config.num_hidden_layers, "dense_layers": config.first_k_dense_replace,
                  "hidden": config.hidden_size, "heads": config.num_attention_heads,
                  "experts": config.n_routed_experts, "index_topk": config.index_topk,
                  "weight_bytes": weights["total"], "step_dense_weight_bytes": weights["dense"],
                  "expert_bytes": weights["expert"]},
        "memory": {**memory, "cache_pages": num_pages, "cache_bytes": runner.cache.total_bytes},
        "setups": [], "rows": [],
    }
    run_all(runner, cases, fits, weights, bw, args, out)
    if device.type == "cuda":
        out["memory"]["max_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
    write_json(args.json, out)
    print_table(out)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
