"""FP8 KV cache on Hopper with the Triton kernels: sparse MLA decode over ``fp8_656`` pages and the KV stores.

Correctness first (decode of every candidate config against the reference backend on CUDA at the bench shapes,
bit-exact store bytes, dequantize), then CUDA-graph timings of the decode (batch 1/16/64/128, 32K context per
request, 128 and 16 heads, top-k 2048, page 64) for each candidate config (a config that fails to compile is
reported, not fatal), a split sweep at small batch, the stores (``store_mla`` fp8_656 / bf16, ``store_index_k``)
and ``dequantize_mla`` of gathered rows, beside the reference on CUDA, with the bf16 matmul (8192^3) and
device-copy ceilings measured in the same run. Prints a table last and writes JSON.

    python bench/kv_fp8_triton.py [--out bench/results/kv_fp8_triton.json] [--quick]
"""

# ruff: noqa: B023  (every lambda below is timed and dropped inside its own loop iteration)
from __future__ import annotations

import argparse
import datetime
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bf16_matmul_ceiling_tflops, copy_ceiling_gbs, device_info, time_ms, write_json  # noqa: E402

from dsa_runtime.plugins.cuda_hopper.triton.kv_quant import TritonKVQuant  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.mla_fp8_decode import (  # noqa: E402
    CANDIDATES,
    MIN_CHUNK,
    DecodeConfig,
    choose_splits,
    decode_fp8_656,
    default_config,
    sm_count,
)
from dsa_runtime.reference.kv_quant import ReferenceKVQuant  # noqa: E402
from dsa_runtime.reference.sparse_attn import ReferenceSparseAttn  # noqa: E402

SM_SCALE, CTX, TOPK, PAGE = 0.135234, 32768, 2048, 64
DEV = torch.device("cuda")


def graph_time_ms(fn, reps: int = 20) -> float:
    """Median of ``reps`` replays of ``fn`` captured in a CUDA graph (also proves the call is capturable)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_ms(graph.replay, reps=reps)


def random_fp8_cache(slots: int) -> torch.Tensor:
    """``[slots // 64, 64, 656]`` rows with random finite e4m3 ``c``, power-of-two scales and random bf16 k_pe."""
    cache = torch.randint(0, 256, (slots, 656), dtype=torch.uint8, device=DEV)
    c = cache[:, :512]
    c[(c & 0x7F) == 0x7F] = 0x3C  # no e4m3 NaN
    exps = torch.randint(-8, 1, (slots, 4), device=DEV).float()
    cache[:, 512:528] = torch.exp2(exps).contiguous().view(torch.uint8)
    cache[:, 528:] = torch.randn(slots, 64, device=DEV, dtype=torch.bfloat16).view(torch.uint8)
    return cache.view(-1, PAGE, 656)


def decode_inputs(cache: torch.Tensor, batch: int, heads: int, gen: torch.Generator):
    """q ``[B, 1, H, 576]`` and per request ``TOPK`` distinct slots of its own 32K-token range (5% -1)."""
    q = torch.randn(batch, 1, heads, 576, device=DEV, generator=gen).bfloat16()
    keys = torch.rand(batch, CTX, device=DEV, generator=gen)
    pos = keys.topk(TOPK, dim=1).indices
    idx = pos + torch.arange(batch, device=DEV)[:, None] * CTX
    idx = torch.where(torch.rand(idx.shape, device=DEV, generator=gen) < 0.05, -1, idx)
    return q, idx.int().view(batch, 1, TOPK)


def check_decode(cache, q, idx, cfg) -> str | None:
    """The kit's sparse_attn tolerances with the absolute term scaled by each output row's magnitude: this
    cache's latent values reach 448 (random e4m3 bytes), so an absolute 1e-2 would flag bf16 rounding of P and
    of the output; a wrong slot, scale or softmax still errs by a sizeable fraction of the row."""
    from dsa_runtime.testing.compare import close
    from dsa_runtime.testing.tolerances import Tolerance, tolerance

    out, lse = decode_fp8_656(q, cache, idx, SM_SCALE, config=cfg)
    w_out, w_lse = ReferenceSparseAttn().decode(q, cache, idx, SM_SCALE, layout="fp8_656")
    kit = tolerance("sparse_attn.out")
    scaled = Tolerance(rtol=kit.rtol, atol=0.0, row_atol=kit.atol)  # atol x max |want| of the (query, head) row
    msgs = [close("out", out.float(), w_out.float(), scaled, row_dims=1),
            close("lse", lse, w_lse, tolerance("sparse_attn.lse"))]
    return " | ".join(m for m in msgs if m) or None


def check_stores(gen: torch.Generator) -> list[str]:
    bad = []
    kq, ref = TritonKVQuant(), ReferenceKVQuant()
    n = 4096
    c = (torch.randn(n, 512, device=DEV, generator=gen) * torch.exp2(torch.randint(-6, 7, (n, 1), device=DEV, generator=gen).float())).bfloat16()
    k_pe = torch.randn(n, 64, device=DEV, generator=gen).bfloat16()
    slots = torch.randperm(2 * n, device=DEV, generator=gen)[:n]
    slots[::7] = -1
    for layout, width, dt in (("fp8_656", 656, torch.uint8), ("bf16", 576, torch.bfloat16)):
        a = torch.zeros(2 * n // PAGE, PAGE, width, dtype=dt, device=DEV)
        b = a.clone()
        kq.store_mla(a, slots, c, k_pe, layout=layout)
        ref.store_mla(b, slots, c, k_pe, layout=layout)
        if not torch.equal(a.view(torch.uint8), b.view(torch.uint8)):
            bad.append(f"store_mla {layout}: bytes differ from the reference")
    rows = ref.quantize_mla(c, k_pe, layout="fp8_656")
    if not torch.equal(kq.dequantize_mla(rows, layout="fp8_656"), ref.dequantize_mla(rows, layout="fp8_656")):
        bad.append("dequantize_mla: differs from the reference")
    ic = torch.randint(0, 256, (2 * n // PAGE, PAGE * 132), dtype=torch.uint8, device=DEV)
    ic2 = ic.clone()
    k8 = torch.randn(n, 128, device=DEV, generator=gen).to(torch.float8_e4m3fn)
    ks = torch.rand(n, device=DEV, generator=gen)
    kq.store_index_k(ic, slots, k8, ks)
    ref.store_index_k(ic2, slots, k8, ks)
    if not torch.equal(ic, ic2):
        bad.append("store_index_k: bytes differ")
    g8, gs = kq.gather_index_k(ic, slots.clamp(min=0))
    r8, rs = ref.gather_index_k(ic2, slots.clamp(min=0))
    if not (torch.equal(g8.view(torch.uint8), r8.view(torch.uint8)) and torch.equal(gs, rs)):
        bad.append("gather_index_k differs")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "kv_fp8_triton.json"))
    ap.add_argument("--batches", default="1,16,64,128")
    ap.add_argument("--quick", action="store_true", help="default config only, no split sweep")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    gen = torch.Generator(device=DEV).manual_seed(0)
    res: dict = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "device": device_info(),
                 "sms": sm_count(DEV)}
    res["bf16_matmul_tflops"] = bf16_matmul_ceiling_tflops()
    res["copy_gbs"] = copy_ceiling_gbs()
    print(f"ceilings: bf16 matmul {res['bf16_matmul_tflops']:.0f} TFLOP/s, copy {res['copy_gbs']:.0f} GB/s", flush=True)

    res["store_errors"] = check_stores(gen)
    print("stores:", res["store_errors"] or "ok", flush=True)
    cache = random_fp8_cache(max(batches) * CTX)
    configs = [None] if args.quick else [None, *CANDIDATES]
    failed: dict[str, str] = {}
    correct: dict[str, str] = {}
    for heads in (128, 16):
        q, idx = decode_inputs(cache, 2, heads, gen)
        for cfg in configs:
            name = f"h{heads}/{cfg or 'default'}"
            try:
                for splits in (1, 3):
                    c = cfg or default_config(heads)
                    c = DecodeConfig(c.block_h, c.block_n, c.num_warps, c.num_stages, splits)
                    if msg := check_decode(cache, q, idx, c):
                        correct[f"{name}/splits{splits}"] = msg
            except Exception as exc:  # a config that does not compile is reported, the others still run
                failed[str(cfg)] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                traceback.print_exc(limit=1)
    res["decode_wrong"], res["configs_failed"] = correct, failed
    print("decode correctness:", correct or "ok", "| failed configs:", failed or "none", flush=True)

    rows = []
    for heads in (128, 16):
        for batch in batches:
            q, idx = decode_inputs(cache, batch, heads, gen)
            flops = 2 * batch * heads * TOPK * (576 + 512)
            read_ms = batch * TOPK * 656 / (res["copy_gbs"] / 2) / 1e6  # selected rows at copy read bandwidth
            for cfg in configs:
                if str(cfg) in failed:
                    continue
                c = cfg or default_config(heads)
                try:
                    ms = graph_time_ms(lambda c=c: decode_fp8_656(q, cache, idx, SM_SCALE, config=c))
                except Exception as exc:
                    failed[f"{c} b{batch} h{heads}"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                    continue
                hblocks = -(-heads // c.block_h)
                splits = c.splits or choose_splits(batch * hblocks, TOPK, c.block_n, res["sms"], MIN_CHUNK)
                rows.append({"op": "decode", "heads": heads, "batch": batch, "config": str(cfg or "default"),
                             "block_h": c.block_h, "block_n": c.block_n, "warps": c.num_warps, "stages": c.num_stages,
                             "splits": splits, "ms": ms, "tflops": flops / ms / 1e9,
                             "pct_matmul": 100 * flops / ms / 1e9 / res["bf16_matmul_tflops"],
                             "x_read_time": ms / read_ms})
            if batch in (1, 16) and not args.quick:
                base = default_config(heads)
                for splits in (1, 4, 8, 16, 32, 64):
                    c = DecodeConfig(base.block_h, base.block_n, base.num_warps, base.num_stages, splits)
                    ms = graph_time_ms(lambda c=c: decode_fp8_656(q, cache, idx, SM_SCALE, config=c))
                    rows.append({"op": "decode_splits", "heads": heads, "batch": batch, "config": str(c),
                                 "splits": splits, "ms": ms, "x_read_time": ms / read_ms})
            if batch in (1, 64):
                ms = time_ms(lambda: ReferenceSparseAttn().decode(q, cache, idx, SM_SCALE, layout="fp8_656"), reps=3)
                rows.append({"op": "decode_reference", "heads": heads, "batch": batch, "ms": ms})
            print(f"decode h{heads} b{batch} done", flush=True)

    kq, ref = TritonKVQuant(), ReferenceKVQuant()
    for n in (1, 64, 4096):
        c = torch.randn(n, 512, device=DEV, generator=gen).bfloat16()
        k_pe = torch.randn(n, 64, device=DEV, generator=gen).bfloat16()
        slots = torch.randperm(CTX * 4, device=DEV, generator=gen)[:n]
        for layout, width, dt in (("fp8_656", 656, torch.uint8), ("bf16", 576, torch.bfloat16)):
            cc = torch.zeros(CTX * 4 // PAGE, PAGE, width, dtype=dt, device=DEV)
            for name, impl in (("triton", kq), ("reference", ref)):
                ms = time_ms(lambda impl=impl: impl.store_mla(cc, slots, c, k_pe, layout=layout))
                rows.append({"op": f"store_mla_{layout}", "impl": name, "tokens": n, "ms": ms})
        ic = torch.zeros(CTX * 4 // PAGE, PAGE * 132, dtype=torch.uint8, device=DEV)
        k8 = torch.randn(n, 128, device=DEV, generator=gen).to(torch.float8_e4m3fn)
        ks = torch.rand(n, device=DEV, generator=gen)
        for name, impl in (("triton", kq), ("reference", ref)):
            ms = time_ms(lambda impl=impl: impl.store_index_k(ic, slots, k8, ks))
            rows.append({"op": "store_index_k", "impl": name, "tokens": n, "ms": ms})
    flat = cache.view(-1, 656)
    for n in (4096, 32768):
        sel = torch.randperm(flat.shape[0], device=DEV, generator=gen)[:n]
        gathered = flat[sel]
        for name, impl in (("triton", kq), ("reference", ref)):
            ms = time_ms(lambda impl=impl: impl.dequantize_mla(gathered, layout="fp8_656"))
            rows.append({"op": "dequantize_mla", "impl": name, "tokens": n, "ms": ms,
                         "gbs": n * (656 + 1152) / ms / 1e6})
        ms = time_ms(lambda: kq.dequantize_mla(flat[sel], layout="fp8_656"))
        rows.append({"op": "gather+dequantize_mla", "impl": "triton", "tokens": n, "ms": ms,
                     "gbs": n * (2 * 656 + 1152) / ms / 1e6})
    res["rows"], res["configs_failed"] = rows, failed
    write_json(args.out, res)

    print(f"\n{'op':24} {'h':>4} {'b/n':>6} {'config':54} {'splits':>6} {'ms':>9} {'TF/s':>7} {'%mm':>6} {'xread':>7}")
    for r in rows:
        print(f"{r['op']:24} {r.get('heads', ''):>4} {r.get('batch', r.get('tokens', '')):>6} "
              f"{str(r.get('config', r.get('impl', '')))[:54]:54} {r.get('splits', ''):>6} {r['ms']:9.4f} "
              f"{r.get('tflops', 0):7.1f} {r.get('pct_matmul', 0):6.1f} {r.get('x_read_time', 0):7.1f}")
    best = {}
    for r in rows:
        if r["op"] == "decode":
            key = (r["heads"], r["batch"])
            if key not in best or r["ms"] < best[key]["ms"]:
                best[key] = r
    print("\nbest decode config per (heads, batch):")
    for (h, b), r in sorted(best.items()):
        print(f"  h{h} b{b}: {r['config']} splits {r['splits']}: {r['ms']:.4f} ms, {r['pct_matmul']:.1f}% of matmul, "
              f"{r['x_read_time']:.1f}x read time")
    print(f"wrote {args.out}")
    return 1 if (correct or res["store_errors"]) else 0


if __name__ == "__main__":
    sys.exit(main())
