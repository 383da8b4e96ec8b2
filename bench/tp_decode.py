"""Tensor parallelism on GPUs: tp 2 equals tp 1, and decode tokens/s at tp 1 and tp 2, in one run.

Two models, random bf16 weights built in memory on each rank's GPU (every rank draws the same full tensors
and keeps its slices, so tp 2 is exactly the tp 1 model split):

* ``tiny``: the tiny V3.2 preset (4 heads -> 2 per rank);
* ``real``: 2 layers at DeepSeek-V3.2's real dimensions (hidden 7168, 128 heads -> 64 per rank, MLA ranks
  1536 / 512, indexer 64 x 128, vocab 129280; layer 0 dense FFN 18432, layer 1 MoE with 256 experts of
  2048, top 8, 1 shared expert), ``--moe-layers 0`` for two dense layers.

For each model: tp 1 runs in this process on cuda:0, then tp 2 (rank 0 here, rank 1 spawned, NCCL). Both run
the same ragged prefill and ``--steps`` greedy-fed decode steps of ``--batch`` requests; logits of the
prefill's last rows and of the first decode step are compared (max |diff|, top-1 agreement), then decode
steps are timed (CUDA-synchronised wall clock, median-free: total tokens / total seconds).

Prompts are ``prompt/2 .. prompt`` tokens (default 128-256), so one default run also checks the tiny
preset's acceptance point (tp 2 next-token top-1 agreement and max |diff| vs tp 1 on 128-256-token prompts,
``--tp-reduce-dtype fp32``, tp 1 with ``moe_fp32_sum``); the last lines print it per model.

Decode steps are token rows (``core/model/step.py``) of slots 0 .. batch-1, replaying a CUDA graph of the batch on
every rank (``--graphs 0``: eager).

Usage: ``python bench/tp_decode.py [--models tiny,real] [--batch 32] [--prompt 256] [--steps 32]
[--tp-reduce-dtype fp32] [--tp1-moe-fp32 1] [--graphs 1] [--profile] [--out tp_decode.json]``.

``--profile`` records the timed decode steps of each tp degree with torch.profiler on rank 0 and prints, per step,
the wall time beside the GPU's busy time (kernel time; NCCL's all-reduces separately), the kernels launched
and what is left: time the GPU waits for the host.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def model_config(name: str, moe_layers: int):
    from dsa_runtime.loader.presets import preset_config
    from dsa_runtime.model.config import ModelConfig

    if name == "tiny":
        cfg = preset_config("tiny-v32")
    else:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        from tests.loader.real_configs import v32_671b

        cfg = copy.deepcopy(v32_671b())
        cfg["num_hidden_layers"] = 2
        cfg["first_k_dense_replace"] = 2 - moe_layers
    cfg.pop("quantization_config", None)  # bf16 weights built in memory
    cfg["num_nextn_predict_layers"] = 0
    return ModelConfig.from_hf(cfg)


def batches(config, batch: int, prompt: int, page: int, seed: int):
    """Prompts of ragged lengths (prompt/2 .. prompt) and page tables (disjoint, never page 0)."""
    from dsa_runtime.model.seqs import ForwardSeq

    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(prompt // 2, prompt + 1, (batch,), generator=g).tolist()
    per = -(-(prompt + 512) // page)
    seqs = []
    for i, n in enumerate(lens):
        ids = torch.randint(0, config.vocab_size, (n,), generator=g).tolist()
        seqs.append(ForwardSeq(ids, 0, list(range(1 + i * per, 1 + (i + 1) * per)), "last"))
    return seqs, 1 + batch * per


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def decode_step(seqs, lengths: list[int], tokens: list[int], page: int):
    """One decode step of every sequence (sequence ``i`` in slot ``i``, as the prefill put it), carrying only the
    block-table entries of the pages the step starts, as the engine sends them."""
    from dsa_runtime.model.step import Step, StepKind

    entries = [[i, n // page, s.page_table[n // page]] for i, (n, s) in enumerate(zip(lengths, seqs, strict=True))
               if n % page == 0]
    return Step.of(StepKind.TARGET, list(range(len(seqs))), tokens, lengths,
                   pages=torch.tensor(entries, dtype=torch.int64).T.contiguous() if entries else None)


def run(runner, seqs, steps: int, page: int, profile: bool = False) -> dict:
    """Prefill, then ``steps`` decode steps (token rows; a graph replay where one is captured) fed with
    tp-independent tokens; returns logits and timings (with ``profile``, ``common.step_profile`` of the timed
    steps too)."""
    from dsa_runtime.model.seqs import ForwardBatch, forward

    sync()
    t0 = time.perf_counter()
    pre = forward(runner, ForwardBatch(seqs))
    sync()
    t_pre = time.perf_counter() - t0
    lengths = [len(s.token_ids) for s in seqs]
    feed = torch.Generator().manual_seed(99)
    first = None
    times = []
    prof = None
    for step in range(steps):
        if profile and step == 2:  # the same steps the timing counts, after two warm-up steps
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as torch_profile

            prof = torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            prof.__enter__()
        # Fixed random next tokens (not argmax): both tp degrees decode exactly the same sequence.
        nxt = torch.randint(0, pre[0].shape[-1], (len(seqs),), generator=feed).tolist()
        sync()
        t1 = time.perf_counter()
        out = runner.run(decode_step(seqs, lengths, nxt, page))
        sync()
        times.append(time.perf_counter() - t1)
        if step == 0:
            first = out.float().cpu()
        lengths = [n + 1 for n in lengths]
    timed = times[2:] if len(times) > 4 else times  # first steps warm up kernels / caches
    extra = {}
    if prof is not None:
        prof.__exit__(None, None, None)
        from common import step_profile

        extra = {"profile": step_profile(prof, steps - 2, 1e3 * sum(times[2:]) / (steps - 2))}
    return {
        **extra,
        "prefill": torch.stack([o.float().cpu() for o in pre]),
        "decode0": first,
        "prefill_s": t_pre,
        "decode_step_ms": 1e3 * sum(timed) / len(timed),
        "decode_tok_s": len(seqs) * len(timed) / sum(timed),
    }


def compare(a: dict, b: dict) -> dict:
    out = {}
    for key in ("prefill", "decode0"):
        x, y = a[key], b[key]
        out[key] = {
            "max_abs_diff": float((x - y).abs().max()),
            "mean_abs_diff": float((x - y).abs().mean()),
            "logit_scale": float(x.abs().mean()),
            "top1_agree": float((x.argmax(-1) == y.argmax(-1)).float().mean()),
        }
    return out


def bench_model(name: str, args) -> dict:
    from dsa_runtime.cache import KVCache
    from dsa_runtime.distributed import ParallelConfig, RankInfo
    from dsa_runtime.distributed.random_weights import rank_random_state
    from dsa_runtime.distributed.runtime import DistributedRunner
    from dsa_runtime.distributed.worker import RankSpec
    from dsa_runtime.model.runner import ModelRunner, kernel_needs
    from dsa_runtime.resolve import KernelConfig, resolve_kernels

    config = model_config(name, args.moe_layers)
    page = 64
    seqs, num_pages = batches(config, args.batch, args.prompt, page, seed=1)
    dev = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    result: dict = {"model": name, "layers": config.num_hidden_layers, "heads": config.num_attention_heads,
                    "hidden": config.hidden_size, "batch": args.batch, "prompt_max": args.prompt,
                    "steps": args.steps, "tp_reduce_dtype": args.tp_reduce_dtype,
                    "tp1_moe_fp32": bool(args.tp1_moe_fp32)}
    t0 = time.perf_counter()
    tensors = rank_random_state(config, RankInfo(0, 1, 1, 1), dev, seed=args.seed)
    kcfg = KernelConfig() if args.device == "cuda" else KernelConfig(platform="cpu")
    kernels = resolve_kernels(kcfg, needs=kernel_needs(config, page))
    result["kernels"] = {m: c.backend for m, c in kernels.choices.items()}
    dtype = getattr(torch, args.dtype)
    cache = KVCache(config, num_pages, page, kernels.kv_layout, dev, dtype)
    # tp 1 rounds the MoE's fp32 expert sum once, as the tp 2 ranks round their fp32 partial sums
    # (--tp-reduce-dtype fp32): the two differ by fp32 summation order only.
    runner = ModelRunner(config, tensors, kernels=kernels, cache=cache, dtype=dtype, device=dev,
                         moe_fp32_sum=bool(args.tp1_moe_fp32), max_requests=args.batch)
    del tensors
    graphs = [args.batch] if args.graphs else []
    runner.capture_graphs(graphs, progress=False)
    result["tp1_build_s"] = time.perf_counter() - t0
    result["tp1_gpu_bytes"] = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else None
    log(f"{name}: tp 1 built in {result['tp1_build_s']:.1f} s")
    tp1 = run(runner, seqs, args.steps, page, args.profile)
    log(f"{name}: tp 1 ran: {tp1['decode_tok_s']:.1f} tok/s")
    del runner, cache
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    t0 = time.perf_counter()
    spec = RankSpec(config=config, random_seed=args.seed, dtype=args.dtype, device_type=dev.type,
                    kernel_config=kcfg, num_pages=num_pages, page_size=page, cpu_threads=None,
                    max_requests=args.batch, graph_batch_sizes=graphs if dev.type == "cuda" else [])
    dist_runner = DistributedRunner(ParallelConfig(tp=2, timeout_s=300, reduce_dtype=args.tp_reduce_dtype), spec)
    try:
        result["tp2_build_s"] = time.perf_counter() - t0
        log(f"{name}: tp 2 built in {result['tp2_build_s']:.1f} s")
        result["tp2_rank_bytes"] = dist_runner.collect("dsa_runtime.distributed.worker:loaded_bytes")
        result["tp2_kernels"] = {m: c.backend for m, c in dist_runner.kernels.choices.items()
                                 if m.startswith("sparse_attn")}
        tp2 = run(dist_runner, seqs, args.steps, page, args.profile)
        log(f"{name}: tp 2 ran: {tp2['decode_tok_s']:.1f} tok/s")
    finally:
        dist_runner.shutdown()
    result["compare"] = compare(tp1, tp2)
    for tag, r in (("tp1", tp1), ("tp2", tp2)):
        result[tag] = {k: r[k] for k in ("prefill_s", "decode_step_ms", "decode_tok_s", "profile") if k in r}
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny,real")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--moe-layers", type=int, default=1, choices=(0, 1))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--tp-reduce-dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--tp1-moe-fp32", type=int, default=1, choices=(0, 1),
                   help="1: the tp 1 runner rounds the MoE's fp32 expert sum once (ModelRunner moe_fp32_sum)")
    p.add_argument("--profile", action="store_true",
                   help="torch.profiler over the timed decode steps on rank 0: GPU busy, NCCL and host time per step")
    p.add_argument("--graphs", type=int, default=1, choices=(0, 1),
                   help="1: decode steps replay a CUDA graph of the batch on every rank (0: eager steps)")
    p.add_argument("--out", default=None)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a dry run of the script (gloo)")
    args = p.parse_args()
    if args.device == "cuda" and torch.cuda.device_count() < 2:
        print("bench/tp_decode.py needs 2 CUDA devices", file=sys.stderr)
        return 2
    name0 = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    results = {"device": name0, "torch": torch.__version__,
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "models": []}
    for name in args.models.split(","):
        res = bench_model(name, args)
        results["models"].append(res)
        print(json.dumps(res, indent=1), flush=True)
    if args.out:
        from common import write_json

        write_json(args.out, results)
    for r in results["models"]:
        c = r["compare"]
        print(f"{r['model']}: tp1 {r['tp1']['decode_tok_s']:.0f} tok/s ({r['tp1']['decode_step_ms']:.1f} ms/step), "
              f"tp2 {r['tp2']['decode_tok_s']:.0f} tok/s ({r['tp2']['decode_step_ms']:.1f} ms/step); "
              f"prefill max|diff| {c['prefill']['max_abs_diff']:.4f} top1 {c['prefill']['top1_agree']:.3f}; "
              f"decode0 max|diff| {c['decode0']['max_abs_diff']:.4f} top1 {c['decode0']['top1_agree']:.3f} "
              f"(reduce {r['tp_reduce_dtype']}, prompts {args.prompt // 2}-{args.prompt} tokens)")
    if args.profile:
        print("\n| model | tp | step wall ms | GPU busy ms (rank 0) | of which NCCL | kernels / step | not on the GPU ms |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in results["models"]:
            for tag in ("tp1", "tp2"):
                f = r[tag].get("profile")
                if f:
                    print(f"| {r['model']} | {tag[2:]} | {f['wall_ms']:.2f} | {f['gpu_busy_ms']:.2f} | {f['nccl_ms']:.2f} | "
                          f"{f['kernels_per_step']:.0f} | {f['not_gpu_ms']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
