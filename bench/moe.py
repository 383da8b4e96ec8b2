"""MoE benchmark of the cuda_hopper ``triton`` backend at DeepSeek-V3.2 sizes.

Correctness first (the quick MoE conformance cases, then each variant against the reference at full size),
then routing and experts for decode (1, 16, 64, 128 tokens) and prefill (4096, 8192 tokens) beside plain
PyTorch (the reference backend on CUDA and a simple torch loop), with the copy and FP8 matmul ceilings
measured in the same run. Prints a table last and writes JSON.

    python bench/moe.py --out moe.json [--tokens 1,16,64,128,4096,8192] [--sweep]
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    bench_ms,
    copy_ceiling_gbs,
    device_info,
    fp8_matmul_ceiling_tflops,
    graph_ms,
    kernel_times_us,
    write_json,
)
from moe_setup import expert_bytes, random_experts, rel_l2_rows, torch_loop  # noqa: E402

from dsa_runtime.plugins.cuda_hopper.triton.moe_experts import TileConfig, TritonMoE  # noqa: E402
from dsa_runtime.reference.moe import ReferenceMoE  # noqa: E402
from dsa_runtime.testing import run_conformance  # noqa: E402

D, INTER, E, TOPK, GROUPS, KEEP, SCALE = 7168, 2048, 256, 8, 8, 4, 2.5
def _tc(bm, up, down, group=1, split=False):
    """TileConfig from (block_n, warps, stages) of each GEMM, the row-block group size and the split w13 tile."""
    return TileConfig(bm, block_n_up=up[0], warps_up=up[1], stages_up=up[2],
                      block_n_down=down[0], warps_down=down[1], stages_down=down[2], group_m=group, split_n=split)


SWEEP = {  # earlier sweeps (docs/benchmarks.md) chose the defaults; these confirm them beside neighbours
    "decode": [_tc(16, (128, 4, 3), (128, 4, 3)), _tc(16, (64, 4, 3), (128, 4, 3)), _tc(16, (128, 4, 4), (64, 4, 4))],
    "prefill": [  # row-block groups of 16 and the two-pass w13 tile: 13.53 vs 13.78 ms before (H100, 03:22 UTC)
        _tc(64, (128, 4, 3), (128, 4, 4), 16, True), _tc(64, (128, 8, 3), (128, 4, 4)),
        _tc(64, (128, 4, 4), (128, 4, 4), 16, True), _tc(64, (64, 4, 4), (128, 4, 4), 16),
    ],
}
ROUTE_SWEEP = [(bt, nw) for bt in (2, 4, 8, 16) for nw in (1, 2, 4)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="1,16,64,128,4096,8192")
    ap.add_argument("--out", default="moe_bench.json")
    ap.add_argument("--sweep", action="store_true", help="also time tile configurations at 64 and 8192 tokens")
    ap.add_argument("--no-bf16", action="store_true")
    ap.add_argument("--deepgemm", action="store_true", help="also time the deepgemm backend's FP8 experts (needs deep_gemm)")
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    info = {**device_info(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv)}
    print(info, flush=True)
    report = run_conformance("triton", full=False, families=["moe"], device="cuda", progress=False)
    bad = [c for c in report.cases if c.status != "passed"]
    print(f"conformance quick moe: {len(report.cases) - len(bad)}/{len(report.cases)} passed", flush=True)
    for c in bad:
        print("  ", c.status, c.id, c.message[:300])
    copy_gbs, fp8_tf = copy_ceiling_gbs(), fp8_matmul_ceiling_tflops()
    print(f"ceilings: copy {copy_gbs:.0f} GB/s, fp8 _scaled_mm 8192^3 {fp8_tf:.0f} TFLOP/s", flush=True)

    routed8, shared8 = random_experts(E, D, INTER, True, 1), random_experts(1, D, INTER, True, 2)
    routed16 = shared16 = None
    if not args.no_bf16:
        routed16, shared16 = random_experts(E, D, INTER, False, 3), random_experts(1, D, INTER, False, 4)
    per_expert = expert_bytes(routed8)
    moe, apart, ref = TritonMoE("ue8m0"), TritonMoE("ue8m0", fuse_shared=False), ReferenceMoE()
    dg = None
    if args.deepgemm:
        from dsa_runtime.plugins.cuda_hopper.deepgemm_moe import DeepGEMMMoE

        dg = DeepGEMMMoE("ue8m0", check_ids=False)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, results = [], {"info": info, "ceilings": {"copy_gbs": copy_gbs, "fp8_tflops": fp8_tf}, "tokens": {}}
    for t in tokens:
        r = measure(t, gen, moe, apart, ref, routed8, shared8, routed16, shared16, args.sweep, dg)
        used_gb = r["used_experts"] * per_expert / 1e9
        r["weight_gb"] = used_gb
        best = min(r["fp8_ms"], r["fp8_graph_ms"])
        r["bw_frac"] = used_gb / (r["fp8_ms"] / 1e3) / copy_gbs
        r["bw_frac_graph"] = used_gb / (r["fp8_graph_ms"] / 1e3) / copy_gbs
        r["tflops"] = 6 * D * INTER * r["pairs"] / (best / 1e3) / 1e12
        r["flop_frac"] = r["tflops"] / fp8_tf
        results["tokens"][t] = r
        print(t, {k: v for k, v in r.items() if k != "sweep"}, flush=True)
        rows.append((t, r))
    write_json(args.out, results)
    _table(rows, info, copy_gbs, fp8_tf)
    return 0


def measure(t, gen, moe, apart, ref, routed8, shared8, routed16, shared16, sweep, dg=None) -> dict:
    """Correctness of every variant at ``t`` tokens against the fp32 reference, then their timings."""
    x = torch.randn(t, D, generator=gen, device="cuda").to(torch.bfloat16)
    logits = torch.randn(t, E, generator=gen, device="cuda") * 2
    # A trained correction bias balances the load; a small random one keeps the routing near uniform.
    bias = (torch.rand(E, generator=gen, device="cuda") - 0.5) * 0.04
    rkw = {"top_k": TOPK, "n_group": GROUPS, "topk_group": KEEP, "routed_scaling_factor": SCALE}
    w, ids = moe.route(logits, bias, **rkw)
    _, rids = ref.route(logits, bias, **rkw)
    r: dict = {"route_ids_match": bool((ids.sort(1).values == rids.sort(1).values).all())}
    want = ref.experts(x, w, ids, routed8, shared8)
    r["err_fp8"] = rel_l2_rows(moe.experts(x, w, ids, routed8, shared8), want)
    r["err_fp8_apart"] = rel_l2_rows(apart.experts(x, w, ids, routed8, shared8), want)
    if dg is not None:  # DeepGEMM's grouped GEMMs with our glue, same inputs, same-run timings
        r["err_deepgemm"] = rel_l2_rows(dg.experts(x, w, ids, routed8, shared8), want)
        r["deepgemm_ms"] = bench_ms(lambda: dg.experts(x, w, ids, routed8, shared8))
        r["deepgemm_graph_ms"] = graph_ms(lambda: dg.experts(x, w, ids, routed8, shared8))
        print(f"  deepgemm t={t}: err {r['err_deepgemm']}, {r['deepgemm_ms']:.3f} ms eager, "
              f"{r['deepgemm_graph_ms']:.3f} ms graph", flush=True)
        # Which part is DeepGEMM's grouped GEMMs and which is the torch glue around them
        r["deepgemm_kernels_us"] = kernel_times_us(lambda: dg.experts(x, w, ids, routed8, shared8))
        top = sorted(r["deepgemm_kernels_us"].items(), key=lambda kv: -kv[1])[:8]
        print(f"  deepgemm kernels t={t}: " + ", ".join(f"{n[:40]} {v:.0f}" for n, v in top), flush=True)
    del want
    if routed16 is not None and t <= 4096:
        want = ref.experts(x, w, ids, routed16, shared16)
        r["err_bf16"] = rel_l2_rows(moe.experts(x, w, ids, routed16, shared16), want)
        del want
    r["route_ms"] = bench_ms(lambda: moe.route(logits, bias, **rkw))
    r["route_graph_ms"] = graph_ms(lambda: moe.route(logits, bias, **rkw))
    r["route_torch_ms"] = bench_ms(lambda: ref.route(logits, bias, **rkw))
    r["fp8_ms"] = bench_ms(lambda: moe.experts(x, w, ids, routed8, shared8))
    r["fp8_graph_ms"] = graph_ms(lambda: moe.experts(x, w, ids, routed8, shared8))
    r["fp8_apart_ms"] = bench_ms(lambda: apart.experts(x, w, ids, routed8, shared8))
    if routed16 is not None:
        r["bf16_ms"] = bench_ms(lambda: moe.experts(x, w, ids, routed16, shared16))
        r["bf16_graph_ms"] = graph_ms(lambda: moe.experts(x, w, ids, routed16, shared16))
        r["bf16_loop_ms"] = bench_ms(lambda: torch_loop(x, w, ids, routed16, shared16), slow=t > 1024)
    r["loop_ms"] = bench_ms(lambda: torch_loop(x, w, ids, routed8, shared8), slow=t > 1024)
    r["ref_ms"] = bench_ms(lambda: ref.experts(x, w, ids, routed8, shared8), slow=True)
    r["used_experts"] = int(torch.unique(ids[ids >= 0]).numel()) + 1  # + the shared expert
    r["pairs"] = int((ids >= 0).sum()) + t
    r["kernels_us"] = kernel_times_us(lambda: moe.experts(x, w, ids, routed8, shared8))
    print(f"  kernels t={t}: " + ", ".join(f"{k} {v:.0f}" for k, v in list(r["kernels_us"].items())[:8]), flush=True)
    if sweep and t in (64, 8192):
        from dsa_runtime.plugins.cuda_hopper.triton.moe_route import route as fused_route

        r["route_sweep"] = {
            f"bt{bt}/w{nw}": bench_ms(lambda bt=bt, nw=nw: fused_route(logits, bias, **rkw, block_t=bt, num_warps=nw))
            for bt, nw in ROUTE_SWEEP
        }
        print(f"  route sweep t={t}: " + ", ".join(f"{k} {v * 1e3:.1f}us" for k, v in r["route_sweep"].items()))
    if sweep and t in (64, 8192):
        r["sweep"] = {}
        for cfg in SWEEP["decode" if t <= 128 else "prefill"]:
            k = TritonMoE("ue8m0", config=cfg)
            ms = bench_ms(lambda k=k: k.experts(x, w, ids, routed8, shared8))
            parts = kernel_times_us(lambda k=k: k.experts(x, w, ids, routed8, shared8))
            r["sweep"][repr(cfg)] = {"ms": ms, "kernels_us": parts}
            short = {k2: round(v) for k2, v in parts.items() if k2.startswith(("gemm", "combine", "_quant"))}
            print(f"  sweep t={t} bm={cfg.block_m} up={cfg.block_n_up}/{cfg.warps_up}/{cfg.stages_up} "
                  f"down={cfg.block_n_down}/{cfg.warps_down}/{cfg.stages_down} g={cfg.group_m} split={cfg.split_n}: "
                  f"{ms:.3f} ms {short}", flush=True)
    return r


def _table(rows, info, copy_gbs, fp8_tf) -> None:
    nan = float("nan")
    print(f"\nMoE on {info['gpu']} ({info['date']}), torch {info['torch']}, triton {info['triton']}; "
          f"ceilings: copy {copy_gbs:.0f} GB/s, fp8 mm {fp8_tf:.0f} TFLOP/s")
    print(f"{'T':>5} {'route':>7} {'rt.g':>7} {'r.torch':>7} {'fp8':>7} {'fp8.g':>7} {'apart':>7} {'bf16':>7} "
          f"{'bf16.g':>7} {'loop8':>7} {'loop16':>7} {'ref':>7} {'x8':>5} {'x16':>5} {'xrt':>5} {'GB':>5} "
          f"{'%copy':>5} {'%cp.g':>5} {'TF/s':>5} {'%fp8':>5} {'err8':>6}")
    for t, r in rows:
        print(f"{t:>5} {r['route_ms']:7.4f} {r['route_graph_ms']:7.4f} {r['route_torch_ms']:7.3f} {r['fp8_ms']:7.3f} "
              f"{r['fp8_graph_ms']:7.3f} {r['fp8_apart_ms']:7.3f} {r.get('bf16_ms', nan):7.3f} "
              f"{r.get('bf16_graph_ms', nan):7.3f} {r['loop_ms']:7.2f} {r.get('bf16_loop_ms', nan):7.2f} "
              f"{r['ref_ms']:7.1f} {r['loop_ms'] / r['fp8_ms']:5.1f} {r.get('bf16_loop_ms', nan) / r.get('bf16_ms', nan):5.1f} "
              f"{r['route_torch_ms'] / r['route_ms']:5.1f} {r['weight_gb']:5.2f} {100 * r['bw_frac']:5.1f} "
              f"{100 * r['bw_frac_graph']:5.1f} {r['tflops']:5.0f} {100 * r['flop_frac']:5.1f} {r['err_fp8'][1]:6.4f}")
    print("ms, medians; .g = CUDA-graph replay; x8/x16/xrt = eager speed-up over the torch loop (fp8, bf16) and "
          "torch routing; %copy = used experts' weight bytes / time / copy ceiling (eager, graph); TF/s and %fp8 = "
          "6*D*I*pairs / best fp8 time; err8 = max per-token rel. L2 of fp8 vs the fp32 reference")


if __name__ == "__main__":
    sys.exit(main())
