"""The full-size V3.2 architecture served on N GPUs: ``--tp N`` and ``--tp N --dp N --enable-dp-attention``.

The model is DeepSeek-V3.2 at its real dimensions (hidden 7168, 128 heads, MLA 1536 / 512, indexer 64 x 128,
top-k 2048, vocab 129280; 3 dense layers of 18432, then MoE layers of 256 routed experts of 2048, top 8, one
shared expert) with **random weights in FP8 blocks** as the released checkpoint stores them, drawn on each
rank's GPU for that rank's slices only (``RankSpec(random_seed=..., random_fp8=True)``). ``--layers 61`` is the
real depth (about 690 GB of weights: 8 H200s); ``--layers auto`` takes as many as fit the GPUs at hand (the
2-GPU rehearsal).

Per topology the engine (the same ``Engine`` the server runs, no HTTP) serves:

* the load: ``--requests`` random prompts of ``--input-len`` tokens arriving at once, ``--output-len`` tokens
  each (EOS ignored): output tokens/s, TTFT and TPOT p50 / p99 (TPOT: a request's decode time over its output
  tokens after the first), the median wall time of full-batch decode steps;
* batch 1: one request, ``--batch1-output`` tokens: TPOT.

Beside them: GPU memory per rank (weights, KV pool, peak), the KV capacity in tokens, the experts a decode
step touches (counted on rank 0 from the router's choices; random weights route almost uniformly, real V3.2
routes with per-expert bias balancing but skewed per batch), and the decode step's roofline per rank: weight
bytes touched (every non-expert weight + the touched routed experts) plus KV bytes read (indexer keys over
the whole context + 2048 selected rows per layer and request), at the copy bandwidth measured in this run.
The public 8 x H200 anchors print beside them (same 1k / 2k / 100-concurrent load).

    python bench/full_size.py --gpus 8 --layers 61 --out docs/bench/full_size_8gpu.json
    python bench/full_size.py --gpus 2 --layers auto --output-len 256 --out docs/bench/full_size_2gpu.json
    python bench/full_size.py --device cpu --model tiny --gpus 2     # a dry run of the script (gloo)
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import statistics
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from full_size_plan import (  # noqa: E402  (bench/ on the path first)
    GIB,
    TOPOLOGY_NAMES,
    Topology,
    auto_layers,
    checkpoint_bytes,
    decode_roofline,
    max_rank_bytes,
    model_config,
    plan_kv,
    plan_only,
    topologies,
    uniform_touched,
)

# GPUStack's published lab numbers, 8 x H200, 1k in / 2k out, 100 prompts, 100 concurrent.
ANCHORS = (
    ("SGLang v0.5.6.post2, TP8 DP8 + DP attention, 8 x H200", 2469.0, 39.45),
    ("vLLM v0.13.0, TP8, 8 x H200", 2075.0, 45.72),
)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- the load ---------------------------------------------------------------------------------------------
class NullTokenizer:
    """Token ids only: the load is synthetic, nothing is turned into text."""

    eos_id = None

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        return ""


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


class RouteCounter:
    """Wraps rank 0's ``kernels.moe.route``: the experts chosen per call (one MoE layer of one step), kept on the
    device while ``on`` (counting then would sync every MoE layer of a timed step). Under DP attention the MoE
    sees every group's rows padded to a common count (``distributed.dp``): only the real rows are kept
    (``TPContext.real_tokens``, set on rank 0 each step)."""

    def __init__(self, kernels: Any, tp: Any = None) -> None:
        self.kernels, self.tp, self.calls, self.on = kernels, tp, [], False
        self.inner = kernels.moe.route

        def route(*args: Any, **kw: Any) -> Any:
            weights, ids = self.inner(*args, **kw)
            if self.on:
                self.calls.append(self._real_rows(ids).detach().clone())
            return weights, ids

        try:
            kernels.moe.route = route
            self.installed = True
        except (AttributeError, TypeError):  # a frozen family: fall back to the uniform-routing expectation
            self.installed = False

    def _real_rows(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp is None or self.tp.info.dp == 1 or not self.tp.real_tokens:
            return ids
        from dsa_runtime.distributed.dp import padded_rows

        pad = padded_rows(self.tp.group_tokens, self.tp.world)
        return torch.cat([ids[g * pad:g * pad + c] for g, c in enumerate(self.tp.real_tokens)])


def serve(engine: Any, prompts: list[list[int]], output_len: int, counter: RouteCounter | None,
          tag: str) -> dict[str, Any]:
    """Every prompt arrives now; steps the engine to the end. Per-request TTFT / TPOT, per-step wall times."""
    from dsa_runtime.engine import SamplingParams

    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0.0)
    t0 = time.monotonic()
    for i, p in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", p, params)
    done: dict[str, Any] = {}
    steps: list[tuple[float, int, int]] = []  # (wall s, requests running, tokens produced)
    last_report = t0
    while engine.has_unfinished():
        s0 = time.perf_counter()
        stats = engine.stats()
        running = stats.num_running
        full_decode = running == len(prompts) and stats.num_waiting == 0
        if counter is not None:
            counter.on = full_decode and len(prompts) > 1
        outs = engine.step()
        steps.append((time.perf_counter() - s0, running if full_decode else -1, sum(len(o.new_token_ids) for o in outs)))
        for o in outs:
            if o.finished:
                done[o.request_id] = o
        if time.monotonic() - last_report > 30:
            last_report = time.monotonic()
            log(f"{tag}: {len(done)}/{len(prompts)} done, {sum(s[2] for s in steps)} tokens out")
    wall = time.monotonic() - t0
    if counter is not None:
        counter.on = False
    ttft, tpot, out_tokens = [], [], 0
    for o in done.values():
        m, n = o.metrics, len(o.token_ids)
        out_tokens += n
        ttft.append(m.first_token - m.arrival)
        if n > 1:
            tpot.append((m.finished - m.first_token) / (n - 1))
    decode_steps = [s[0] for s in steps if s[1] == len(prompts)]
    return {
        "requests": len(prompts), "input_len": len(prompts[0]), "output_len": output_len, "wall_s": wall,
        "output_tokens": out_tokens, "output_tok_s": out_tokens / wall,
        "ttft_ms_p50": 1e3 * percentile(ttft, 50), "ttft_ms_p99": 1e3 * percentile(ttft, 99),
        "tpot_ms_p50": 1e3 * percentile(tpot, 50), "tpot_ms_p99": 1e3 * percentile(tpot, 99),
        "tpot_ms_mean": 1e3 * statistics.fmean(tpot) if tpot else float("nan"),
        "full_batch_decode_step_ms_p50": 1e3 * percentile(decode_steps, 50) if decode_steps else None,
        "steps": len(steps),
    }


def profile_decode(engine: Any, prompts: list[list[int]], steps: int, tag: str, stacks: bool = False) -> dict[str, Any]:
    """Full-batch decode steps under torch.profiler on rank 0: wall time beside the GPU's busy time (NCCL apart),
    the rest being host time (Python, the step's dispatch to the other ranks, waiting), and the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    from dsa_runtime.engine import SamplingParams

    params = SamplingParams(max_tokens=steps + 64, ignore_eos=True, temperature=0.0)
    ids = [f"{tag}-prof-{i}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts, strict=True):
        engine.add_request(rid, prompt, params)
    while (stats := engine.stats()).num_waiting or stats.num_running < len(prompts):
        engine.step()
    for _ in range(3):  # past the last prefill chunk: pure decode
        engine.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=stacks) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / steps * 1e3
    for rid in ids:
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()
    from common import step_profile

    host = {}
    for e in prof.key_averages():
        if e.key.startswith(("gather_object", "broadcast_object", "c10d::", "aten::to", "aten::copy_", "cudaMemcpy")):
            host[e.key] = e.cpu_time_total / 1e3 / steps
    copies = []
    if stacks:  # where the host-side copies come from (Python frames of the costliest copy_ / to call sites)
        for e in sorted(prof.key_averages(group_by_stack_n=8), key=lambda e: -e.cpu_time_total):
            if e.key in ("aten::copy_", "aten::to", "aten::_to_copy") and len(copies) < 8:
                copies.append({"op": e.key, "cpu_ms_per_step": e.cpu_time_total / 1e3 / steps,
                               "calls_per_step": e.count / steps, "stack": list(e.stack)})
    return {"batch": len(prompts), "steps": steps, **step_profile(prof, steps, wall, top=10),
            "host_ops_ms": dict(sorted(host.items(), key=lambda kv: -kv[1])[:8]), "copy_sites": copies}


# --- one topology ------------------------------------------------------------------------------------------
def run_topology(config: Any, topo: Topology, args: argparse.Namespace, num_pages: int, page: int,
                 copy_gbs: float) -> dict[str, Any]:
    from dsa_runtime.cache import PageAllocator
    from dsa_runtime.distributed.runtime import DistributedRunner
    from dsa_runtime.distributed.worker import RankSpec
    from dsa_runtime.engine import Engine, EngineConfig
    from dsa_runtime.engine.parts import EngineParts
    from dsa_runtime.resolve import KernelConfig

    kcfg = KernelConfig() if args.device == "cuda" else KernelConfig(platform="cpu")
    spec = RankSpec(config=config, random_seed=args.seed, random_fp8=True, dtype="bfloat16",
                    device_type=args.device, kernel_config=kcfg, num_pages=num_pages, page_size=page,
                    cpu_threads=1 if args.device == "cpu" else None)
    t0 = time.perf_counter()
    runner = DistributedRunner(topo.parallel(args.timeout), spec)
    out: dict[str, Any] = {"topology": topo.name, "tp": topo.tp, "dp": topo.dp, "ep": topo.ep}
    try:
        out["build_s"] = time.perf_counter() - t0
        log(f"{topo.name}: built in {out['build_s']:.0f} s")
        out["kernels"] = {m: c.backend for m, c in runner.kernels.choices.items()}
        out["memory_per_rank"] = runner.collect("dsa_runtime.distributed.worker:memory_stats")
        parts = EngineParts(runner=runner, tokenizer=NullTokenizer(), allocator=PageAllocator(num_pages),
                            page_size=page, max_model_len=args.input_len + args.output_len + 16,
                            vocab_size=config.vocab_size, eos_token_ids=frozenset(), model_config=config)
        engine = Engine(EngineConfig(max_running_requests=max(args.requests, 1), disable_radix_cache=True,
                                     chunked_prefill_size=args.chunked_prefill_size), parts=parts)
        out["kv_capacity_tokens"] = (num_pages - 1) * page
        counter = RouteCounter(runner.kernels, runner.tp)
        rng = random.Random(args.seed)

        def prompts(n: int) -> list[list[int]]:
            return [[rng.randrange(2, config.vocab_size) for _ in range(args.input_len)] for _ in range(n)]

        log(f"{topo.name}: warm-up")
        serve(engine, prompts(2), 4, None, f"{topo.name}-warm")
        log(f"{topo.name}: {args.requests} requests x {args.input_len} in / {args.output_len} out")
        before = runner.ep_tokens()
        out["load"] = serve(engine, prompts(args.requests), args.output_len, counter, f"{topo.name}-load")
        if topo.ep > 1:  # token rows each EP rank's experts received during the load, per step
            rows = [a - b for a, b in zip(runner.ep_tokens(), before, strict=True)]
            per_step = [n / out["load"]["steps"] for n in rows]
            mean = sum(per_step) / len(per_step)
            out["ep_rows_per_step"] = {"per_rank": per_step, "max": max(per_step), "mean": mean,
                                       "max_over_mean": max(per_step) / mean if mean else 0.0}
        log(f"{topo.name}: load {out['load']['output_tok_s']:.0f} tok/s; batch 1")
        out["batch1"] = serve(engine, prompts(1), args.batch1_output, None, f"{topo.name}-b1")
        if args.profile_steps and args.device == "cuda":
            out["profile"] = profile_decode(engine, prompts(args.requests), args.profile_steps, topo.name,
                                            stacks=args.profile_stacks)
            log(f"{topo.name}: profiled step {out['profile']['wall_ms']:.1f} ms, GPU busy "
                f"{out['profile']['gpu_busy_ms']:.1f} ms")
        out["memory_per_rank_after"] = runner.collect("dsa_runtime.distributed.worker:memory_stats")
        tokens_per_step = args.requests  # every rank's MoE sees every group's tokens
        counts = [int(torch.unique(ids).numel()) for ids in counter.calls if ids.shape[0] == tokens_per_step]
        if counter.installed and counts:
            touched = statistics.fmean(counts)
            out["experts_touched_source"] = f"measured on rank 0 ({len(counts)} MoE layer calls of full-batch decode)"
        else:
            touched = uniform_touched(tokens_per_step, config.n_routed_experts, config.num_experts_per_tok)
            out["experts_touched_source"] = "uniform-routing expectation"
        out["experts_touched_per_moe_layer"] = touched
        out["experts_touched_uniform"] = uniform_touched(tokens_per_step, config.n_routed_experts,
                                                         config.num_experts_per_tok)
        context = args.input_len + args.output_len // 2
        out["roofline"] = decode_roofline(config, topo, args.requests, context, touched, copy_gbs)
        step = out["load"]["full_batch_decode_step_ms_p50"]
        if step:
            out["roofline"]["measured_over_roofline"] = step / out["roofline"]["roofline_ms"]
    finally:
        runner.shutdown()
    return out


def release_gpu(tag: str) -> None:
    """Give rank 0's memory back between topologies, and say what is still held."""
    gc.collect()
    torch.cuda.empty_cache()
    log(f"{tag}: rank 0 holds {torch.cuda.memory_allocated() / GIB:.1f} GiB after shutdown")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=8, help="ranks (one per GPU)")
    p.add_argument("--layers", default="61", help="an int, or auto: as many as fit (first --dense dense)")
    p.add_argument("--dense", type=int, default=3, help="leading dense layers (V3.2: 3)")
    p.add_argument("--topologies", default="tp,dp",
                   help="comma-separated: " + "; ".join(f"{k}: {v}" for k, v in TOPOLOGY_NAMES.items()))
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--input-len", type=int, default=1000)
    p.add_argument("--output-len", type=int, default=2000)
    p.add_argument("--batch1-output", type=int, default=256)
    p.add_argument("--chunked-prefill-size", type=int, default=8192)
    p.add_argument("--mem-fraction-static", type=float, default=0.85,
                   help="share of each GPU for weights + KV + workspaces (SGLang's flag)")
    # Build transients (layer by layer: a dequantised fp32 weight, one layer's experts stacked beside their
    # sources), allocator slack, NCCL and cuBLAS buffers: the KV pool is allocated before the model is built.
    p.add_argument("--headroom-gib", type=float, default=8.0, help="per GPU, kept out of the KV plan")
    p.add_argument("--plan-only", action="store_true",
                   help="print layers, weights and KV per rank for --gpu-memory-gib and exit (no GPU needed)")
    p.add_argument("--gpu-memory-gib", type=float, default=None, help="with --plan-only: one GPU's memory")
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--profile-steps", type=int, default=0,
                   help="then profile this many full-batch decode steps on rank 0 (wall vs GPU busy vs NCCL)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="collective timeout, s")
    p.add_argument("--profile-stacks", action="store_true", help="with --profile-steps: Python stacks of the copies")
    p.add_argument("--model", default="v32", choices=("v32", "tiny"), help="tiny: the tiny preset (dry runs)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.plan_only:
        return plan_only(args)
    if args.device == "cuda" and torch.cuda.device_count() < args.gpus:
        print(f"bench/full_size.py: --gpus {args.gpus} needs {args.gpus} CUDA devices, "
              f"torch sees {torch.cuda.device_count()}", file=sys.stderr)
        return 2
    topos = topologies(args.gpus, args.topologies)
    load_tokens = args.requests * (args.input_len + args.output_len) + 2 * (args.input_len + 8)
    page = args.page_size
    if args.device == "cuda":
        from common import copy_ceiling_gbs, device_info

        info = device_info()
        copy_gbs = copy_ceiling_gbs()
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(0).total_memory
        budget = int(total * args.mem_fraction_static)
    else:
        info, copy_gbs, budget = {"gpu": "cpu"}, 0.0, 8 * GIB
    budget -= int(args.headroom_gib * GIB) if args.device == "cuda" else 0
    if args.layers == "auto":
        layers = auto_layers(args, topos, budget, load_tokens)
    else:
        layers = int(args.layers)
    config = model_config(args.model, layers, args.dense)
    weights = max(max_rank_bytes(config, t) for t in topos)
    if args.device == "cuda":
        plan = plan_kv(config, args, budget=budget - weights)
        num_pages = plan.num_pages
        log(f"KV plan: {plan.max_total_tokens} tokens, workspaces {plan.workspace_bytes / GIB:.1f} GiB "
            f"({', '.join(f'{k} {v / GIB:.1f}' for k, v in plan.workspace.items())})")
    else:
        num_pages = -(-load_tokens // page) + 8
    if (num_pages - 1) * page < load_tokens:
        print(f"bench/full_size.py: {layers} layers leave KV for {(num_pages - 1) * page} tokens, the load needs "
              f"{load_tokens}; lower --layers or the load", file=sys.stderr)
        return 2
    log(f"{info.get('gpu')}: {layers} layers ({config.first_k_dense_replace} dense), weights up to "
        f"{weights / GIB:.1f} GiB per rank, KV {num_pages} pages x {page}, copy {copy_gbs:.0f} GB/s")
    results: dict[str, Any] = {
        "device": info, "gpus": args.gpus, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "layers": layers, "dense_layers": config.first_k_dense_replace, "model": args.model,
        "weights_fp8_all_layers_gb": checkpoint_bytes(config) / 1e9,
        "copy_gbs": copy_gbs, "args": vars(args), "anchors": [
            {"name": n, "output_tok_s": t, "tpot_ms_mean": m} for n, t, m in ANCHORS], "runs": []}
    for topo in topos:
        res = run_topology(config, topo, args, num_pages, page, copy_gbs)
        results["runs"].append(res)
        print(json.dumps(res, indent=1), flush=True)
        if args.out:  # after every topology: a run cut short keeps what it measured
            from common import write_json

            write_json(args.out, results)
        if args.device == "cuda":
            release_gpu(topo.name)
    print_table(results)
    return 0


def print_table(results: dict[str, Any]) -> None:
    gpu, n = results["device"].get("gpu"), results["gpus"]
    print(f"\n{n} x {gpu}, {results['layers']} layers ({results['dense_layers']} dense), "
          f"{results['weights_fp8_all_layers_gb']:.0f} GB of weights in all, copy {results['copy_gbs']:.0f} GB/s")
    print("| topology | load | out tok/s | TPOT p50 / p99 ms | TTFT p50 / p99 ms | full-batch step ms | roofline ms "
          "| step / roofline | b1 TPOT ms | experts touched / layer | GiB / rank (weights, KV, peak) | KV tokens |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results["runs"]:
        ld, b1, rf = r["load"], r["batch1"], r["roofline"]
        mem = r["memory_per_rank_after"]
        peak = max(m.get("peak", 0) for m in mem) / GIB
        w = max(m["weights"] for m in mem) / GIB
        kv = max(m["kv_cache"] for m in mem) / GIB
        step = ld["full_batch_decode_step_ms_p50"]
        print(f"| {r['topology']} | {ld['requests']} x {ld['input_len']}/{ld['output_len']} | {ld['output_tok_s']:.0f} "
              f"| {ld['tpot_ms_p50']:.1f} / {ld['tpot_ms_p99']:.1f} | {ld['ttft_ms_p50']:.0f} / {ld['ttft_ms_p99']:.0f} "
              f"| {step if step is None else f'{step:.1f}'} | {rf['roofline_ms']:.2f} "
              f"| {rf.get('measured_over_roofline', float('nan')):.1f}x | {b1['tpot_ms_p50']:.1f} "
              f"| {r['experts_touched_per_moe_layer']:.0f} (uniform {r['experts_touched_uniform']:.0f}) "
              f"| {w:.1f}, {kv:.1f}, {peak:.1f} | {r['kv_capacity_tokens']} |")
    for a in results["anchors"]:
        print(f"| anchor: {a['name']} | 100 x 1000/2000 | {a['output_tok_s']:.0f} | mean {a['tpot_ms_mean']:.2f} "
              "| | | | | | | | |")
    for r in results["runs"]:
        if "ep_rows_per_step" in r:
            e = r["ep_rows_per_step"]
            print(f"{r['topology']}: token rows per EP rank per step (load average) max {e['max']:.1f} / mean "
                  f"{e['mean']:.1f} = {e['max_over_mean']:.2f}")
    profiled = [r for r in results["runs"] if r.get("profile")]
    if profiled:
        print("\n| topology | batch | step wall ms | GPU busy ms (rank 0) | of which NCCL | kernels / step | not on the GPU ms |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in profiled:
            f = r["profile"]
            print(f"| {r['topology']} | {f['batch']} | {f['wall_ms']:.1f} | {f['gpu_busy_ms']:.1f} | {f['nccl_ms']:.1f} "
                  f"| {f['kernels_per_step']:.0f} | {f['not_gpu_ms']:.1f} |")


if __name__ == "__main__":
    raise SystemExit(main())
