"""Indexer benchmark of the cuda_hopper ``triton`` backend at DeepSeek-V3.2 sizes.

Correctness first: the indexer conformance cases (quick + full tier) on CUDA, then every candidate config
against the reference backend on CUDA at the bench shapes. Then times ``quantize_q`` (4096 x 64 heads),
``quantize_k`` (32K keys), ragged logits (4096 x 8192 and 4096 x 32768, all pairs, 64 heads) and paged
decode logits (batch 1/64/128 at 32K and 128K contexts, 1 query; batch 64 with 2 MTP queries) for each
config, beside plain PyTorch (the reference backend on CUDA), with the FP8 ``_scaled_mm`` 8192^3 ceiling and
a device-copy ceiling measured in the same run. A config that fails to compile or to match is reported,
never fatal. Prints a table last and writes JSON (default ``bench/results/indexer_triton.json``).

    python bench/indexer_triton.py [--out PATH] [--no-kit] [--no-full] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_ms, copy_ceiling_gbs, device_info, fp8_matmul_ceiling_tflops, graph_ms, write_json  # noqa: E402

from dsa_runtime.plugins.cuda_hopper.triton import indexer_logits as il  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.indexer_quant import rotate_quantize  # noqa: E402
from dsa_runtime.reference.indexer import ReferenceIndexer  # noqa: E402

H, D = 64, 128
FLOPS_PER_PAIR = 2 * H * D
QUANT_CONFIGS = {"r64i4w4": (64, 4, 4), "r32i8w4": (32, 8, 4), "r128i2w8": (128, 2, 8), "r64i1w4": (64, 1, 4)}


def rand_fp8(shape, gen) -> torch.Tensor:
    return (torch.randn(shape, device="cuda", generator=gen) * 16).clamp(-448, 448).to(torch.float8_e4m3fn)


def logits_error(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """None when the -inf pattern is exact and finite entries match (rtol 1e-3 + 2e-3 x the row's largest)."""
    if not torch.equal(torch.isneginf(got), torch.isneginf(want)):
        return "-inf pattern differs"
    fin = torch.isfinite(want)
    g, w = torch.where(fin, got, 0.0), torch.where(fin, want, 0.0)
    row_max = w.abs().amax(dim=1, keepdim=True)
    bad = (g - w).abs() > 1e-3 * w.abs() + 2e-3 * row_max
    if bad.any() or torch.isnan(got).any():
        return f"{int(bad.sum())} entries off; worst {float((g - w).abs().max()):.3g}"
    return None


def try_run(name: str, fn):
    try:
        return fn(), None
    except Exception as exc:  # a config that does not compile is a result, not a crash
        msg = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        print(f"  {name}: FAILED {msg}", flush=True)
        return None, msg


def bench_quant(gen, copy_gbs, results, rows) -> None:
    ref = ReferenceIndexer()
    q = torch.randn(4096, H, D, device="cuda", generator=gen).bfloat16()
    hw = torch.randn(4096, H, device="cuda", generator=gen)
    k = torch.randn(32768, D, device="cuda", generator=gen).bfloat16()
    for what, x, w in (("quantize_q 4096x64", q.view(-1, D), hw.view(-1)), ("quantize_k 32768", k, None)):
        nbytes = x.numel() * (2 + 1) + x.shape[0] * (4 + (8 if w is not None else 0))
        want8, want_s = ref.quantize_k(x.float(), scale_fmt="ue8m0")
        t_ref = bench_ms(lambda x=x: ref.quantize_k(x, scale_fmt="ue8m0"), slow=True)
        entry = {"ref_ms": t_ref, "configs": {}}
        for name, (br, it, nw) in QUANT_CONFIGS.items():
            def call(x=x, w=w, br=br, it=it, nw=nw):
                return rotate_quantize(x, "ue8m0", w, H, block_r=br, iters=it, num_warps=nw)
            out, err = try_run(f"{what} {name}", call)
            if err is None:
                q8, s, _ = out
                same_s = float((s == want_s).float().mean())
                same_q = float((q8.view(torch.uint8) == want8.view(torch.uint8)).float().mean())
                if same_s < 0.999 or same_q < 0.99:
                    err = f"mismatch: scales equal {same_s:.4f}, bytes equal {same_q:.4f}"
            if err is not None:
                entry["configs"][name] = {"error": err}
                continue
            ms = bench_ms(call)
            entry["configs"][name] = {"ms": ms, "bw_frac": nbytes / (ms / 1e3) / 1e9 / copy_gbs}
            rows.append((what, name, ms, t_ref, f"{entry['configs'][name]['bw_frac']:.0%} copy BW"))
        results[what] = entry


def bench_ragged(gen, fp8_tf, results, rows, configs) -> None:
    for s in (8192, 32768):
        results[f"ragged 4096x{s}"] = ragged_shape(gen, fp8_tf, rows, configs, 4096, s)
        torch.cuda.empty_cache()


def ragged_shape(gen, fp8_tf, rows, configs, t: int, s: int) -> dict:
    """All-pairs windows (timed) and random windows cut inside tiles with an empty row (checked only)."""
    ref = ReferenceIndexer()
    what = f"ragged {t}x{s}"
    q8, k8 = rand_fp8((t, H, D), gen), rand_fp8((s, D), gen)
    w = torch.randn(t, H, device="cuda", generator=gen) * 1e-4
    sc = torch.rand(s, device="cuda", generator=gen) * 1e-3 + 1e-4
    ks = torch.zeros(t, dtype=torch.int32, device="cuda")
    ke = torch.full((t,), s, dtype=torch.int32, device="cuda")
    ks2 = torch.randint(0, s // 2, (t,), device="cuda", generator=gen, dtype=torch.int32)
    ke2 = (ks2 + torch.randint(0, s // 2, (t,), device="cuda", generator=gen, dtype=torch.int32)).clamp(max=s)
    ke2[7] = ks2[7]
    checks = [((ks, ke), ref.logits_ragged(q8, w, k8, sc, ks, ke)), ((ks2, ke2), ref.logits_ragged(q8, w, k8, sc, ks2, ke2))]
    entry: dict = {"ref_ms": bench_ms(lambda: ref.logits_ragged(q8, w, k8, sc, ks, ke), slow=True), "configs": {}}
    for name, cfg in configs.items():
        err = None
        for (a, b), want in checks:
            out, err = try_run(f"{what} {name}", lambda a=a, b=b, cfg=cfg: il.logits_ragged(q8, w, k8, sc, a, b, cfg))
            err = err or logits_error(out, want)
            del out
            if err:
                break
        if err is not None:
            print(f"  {what} {name}: {err}", flush=True)
            entry["configs"][name] = {"error": err}
            continue
        ms = bench_ms(lambda cfg=cfg: il.logits_ragged(q8, w, k8, sc, ks, ke, cfg))
        tf = FLOPS_PER_PAIR * t * s / (ms / 1e3) / 1e12
        entry["configs"][name] = {"ms": ms, "tflops": tf, "flop_frac": tf / fp8_tf}
        rows.append((what, name, ms, entry["ref_ms"], f"{tf:.0f} TFLOP/s = {tf / fp8_tf:.0%} fp8 mm"))
    return entry


def paged_inputs(gen, batch: int, ctx: int, n_q: int, page: int = 64):
    pages_per = -(-ctx // page)
    n_pages = batch * pages_per
    cache = torch.empty(n_pages, page * 132, dtype=torch.uint8, device="cuda")
    cache[:, : page * D] = rand_fp8((n_pages, page * D), gen).view(torch.uint8)
    scales = torch.rand(n_pages, page, device="cuda", generator=gen) * 1e-3 + 1e-4
    cache[:, page * D:] = scales.view(torch.uint8).view(n_pages, page * 4)
    table = torch.randperm(n_pages, device="cuda", generator=gen).view(batch, pages_per).to(torch.int32)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    if batch > 1:
        lens[1::2] = ctx - 1 - torch.arange(batch // 2, device="cuda", dtype=torch.int32) % page  # partial pages
    q8 = rand_fp8((batch, n_q, H, D), gen)
    w = torch.randn(batch * n_q, H, device="cuda", generator=gen) * 1e-4
    return q8, w, cache, lens, table, ctx


def bench_paged(gen, copy_gbs, results, rows, configs, shapes) -> None:
    for batch, ctx, n_q in shapes:
        what = f"paged b{batch} ctx{ctx // 1024}K n{n_q}"
        results[what] = paged_shape(what, paged_inputs(gen, batch, ctx, n_q), copy_gbs, rows, configs)
        torch.cuda.empty_cache()


def paged_shape(what: str, args: tuple, copy_gbs: float, rows: list, configs: dict) -> dict:
    ref = ReferenceIndexer()
    nbytes = int(args[3].sum()) * 132
    want = ref.logits_paged(*args)
    entry: dict = {"ref_ms": bench_ms(lambda: ref.logits_paged(*args), slow=True), "index_k_bytes": nbytes,
                   "configs": {}}
    for name, cfg in configs.items():
        out, err = try_run(f"{what} {name}", lambda cfg=cfg: il.logits_paged(*args, config=cfg))
        err = err or logits_error(out, want)
        del out
        if err is not None:
            print(f"  {what} {name}: {err}", flush=True)
            entry["configs"][name] = {"error": err}
            continue
        ms = bench_ms(lambda cfg=cfg: il.logits_paged(*args, config=cfg))
        g_ms = graph_ms(lambda cfg=cfg: il.logits_paged(*args, config=cfg))  # NaN when capture fails
        frac = nbytes / (min(ms, g_ms if g_ms == g_ms else ms) / 1e3) / 1e9 / copy_gbs
        entry["configs"][name] = {"ms": ms, "graph_ms": g_ms, "bw_frac": frac}
        rows.append((what, name, ms, entry["ref_ms"], f"graph {g_ms:.3f} ms, {frac:.0%} copy BW over index-K bytes"))
    return entry


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "indexer_triton.json"))
    ap.add_argument("--no-kit", action="store_true", help="skip the conformance cases")
    ap.add_argument("--no-full", action="store_true", help="conformance: quick tier only")
    ap.add_argument("--quick", action="store_true", help="default configs only, fewer decode shapes")
    ap.add_argument("--paged-sweep", action="store_true",
                    help="paged decode only: the default and every PAGED_CONFIGS entry (or --paged-configs) at "
                         "batch 64 x 128K, 128 x 32K, 64 x 32K with 2 queries and 1 x 128K")
    ap.add_argument("--paged-configs", default="", help="with --paged-sweep: comma-separated PAGED_CONFIGS names")
    args = ap.parse_args()
    info = {**device_info(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv)}
    print(info, flush=True)
    results: dict = {"info": info}
    if not args.no_kit:
        from dsa_runtime.testing import run_conformance

        report = run_conformance("triton", full=not args.no_full, families=["indexer"], device="cuda", progress=False)
        bad = [c for c in report.cases if c.status != "passed"]
        print(f"conformance indexer: {len(report.cases) - len(bad)}/{len(report.cases)} passed", flush=True)
        for c in bad:
            print("  ", c.status, c.id, c.message[:300], flush=True)
        results["conformance"] = {"passed": len(report.cases) - len(bad), "total": len(report.cases),
                                  "failed": [f"{c.status} {c.id}: {c.message[:200]}" for c in bad]}
    copy_gbs, fp8_tf = copy_ceiling_gbs(), fp8_matmul_ceiling_tflops()
    print(f"ceilings: copy {copy_gbs:.0f} GB/s, fp8 _scaled_mm 8192^3 {fp8_tf:.0f} TFLOP/s", flush=True)
    results["ceilings"] = {"copy_gbs": copy_gbs, "fp8_tflops": fp8_tf}
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows: list = []
    ragged = {"default": il.RaggedConfig()} if args.quick else il.RAGGED_CONFIGS
    paged = {"default": il.PagedConfig()} if args.quick else il.PAGED_CONFIGS
    shapes = [(1, 32768, 1), (64, 32768, 1), (128, 32768, 1), (1, 131072, 1), (64, 131072, 1), (128, 131072, 1),
              (64, 32768, 2)]
    if args.quick:
        shapes = [(1, 32768, 1), (128, 32768, 1), (64, 131072, 1)]
    steps = [lambda: bench_quant(gen, copy_gbs, results, rows), lambda: bench_ragged(gen, fp8_tf, results, rows, ragged)]
    if args.paged_sweep:
        names = [n for n in args.paged_configs.split(",") if n] or list(il.PAGED_CONFIGS)
        unknown = [n for n in names if n not in il.PAGED_CONFIGS]
        if unknown:
            raise SystemExit(f"unknown --paged-configs {unknown}; valid: {', '.join(il.PAGED_CONFIGS)}")
        paged = {"default": il.PagedConfig(), **{n: il.PAGED_CONFIGS[n] for n in names}}
        shapes = [(64, 131072, 1), (128, 32768, 1), (64, 32768, 2), (1, 131072, 1)]
        steps = []
    for step in (*steps, lambda: bench_paged(gen, copy_gbs, results, rows, paged, shapes)):
        step()
        write_json(args.out, results)  # partial results survive a later crash
    print(f"\n{info['gpu']}, torch {info['torch']}, triton {info['triton']}; copy {copy_gbs:.0f} GB/s, "
          f"fp8 mm {fp8_tf:.0f} TFLOP/s")
    print(f"{'shape':28} {'config':10} {'triton ms':>10} {'ref ms':>9}  note")
    for what, name, ms, t_ref, note in rows:
        print(f"{what:28} {name:10} {ms:10.3f} {t_ref:9.2f}  {note}")
    print(f"JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
