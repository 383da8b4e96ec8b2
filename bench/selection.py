"""Selection benchmark: lightning-indexer logits and top-k on one GPU, beside the ceilings.

Correctness first (the quick conformance cases of the ``triton`` and ``deepgemm`` backends when registered,
then every candidate against the reference on each benchmark input), then times:

* indexer prefill, all pairs: 4096 x 8192 and 4096 x 32K keys (64 heads x 128, FP8) -> ms, TFLOP/s
  (2*64*128 FLOPs per pair), % of the FP8 ``_scaled_mm`` 8192^3 rate;
* indexer decode over the paged index_k_132 cache: batch 1/64/128 at 32K and 128K context -> ms, GB/s of
  index-K bytes read (132 B per token), % of the device copy rate;
* top-k 2048 of 64 x 32K, 64 x 128K, 1 x 128K, 4096 x 8K with random, tied and mostly ``-inf`` rows -> ms and
  exactness against the reference (index-set agreement; rows whose selected values match, the kit's rule);
* one layer of a 128K-token prefill's selection (causal windows, V3.2 shapes) through the chunked path of
  ``core/model/index_select.py``, with its peak extra memory (must stay under 2 GiB).

Candidates: the ``triton`` backend's indexer/top-k (through the registry, default config; skipped with the
reason when not registered), plain PyTorch (the reference backend on CUDA; ``torch.topk``), FlagGems' Triton top-k when
importable, DeepGEMM when built (``deepgemm`` backend). The slow reference is timed on the smallest indexer
prefill shape, batch-1 decode and once per top-k shape (its agreement is checked everywhere). Prints a
table and writes JSON.

    python bench/selection.py [--out bench/results/selection.json] [--skip-prefill-128k] [--no-reference]
"""

from __future__ import annotations

import argparse
import datetime
import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_ms, copy_ceiling_gbs, device_info, fp8_matmul_ceiling_tflops, write_json  # noqa: E402
from selection_setup import (  # noqa: E402
    HEADS,
    TOPK,
    Candidate,
    TorchTopK,
    decode_inputs,
    logits_error,
    prefill_inputs,
    registered,
    topk_agreement,
    topk_logits,
)

from dsa_runtime.reference.indexer import ReferenceIndexer  # noqa: E402
from dsa_runtime.reference.topk import ReferenceTopK  # noqa: E402

PREFILL = [(4096, 8192), (4096, 32768)]
DECODE = [(b, c) for c in (32768, 131072) for b in (1, 64, 128)]
TOPK_SHAPES = [(64, 32768), (64, 131072), (1, 131072), (4096, 8192)]
PATTERNS = ("random", "tied", "neginf")
FLOPS_PER_PAIR = 2 * HEADS * 128
PREFILL_TOKENS = 131072  # one 128K-token prompt (causal windows) for the memory-bounded selection


def conformance(results: dict) -> None:
    from dsa_runtime.testing import run_conformance

    for backend, families in (("triton", ["indexer", "topk"]), ("deepgemm", ["indexer"])):
        kern, why = registered(backend, "indexer.logits_ragged", index_heads=HEADS)
        if kern is None and backend == "triton":
            kern, why = registered(backend, "topk.topk", k=TOPK)
        if kern is None:
            print(f"conformance {backend}: skipped ({why})", flush=True)
            results["conformance"][backend] = {"skipped": why}
            continue
        report = run_conformance(backend, full=False, families=families, device="cuda", progress=False)
        bad = [c for c in report.cases if c.status not in ("passed", "skipped", "unclaimed")]
        ran = [c for c in report.cases if c.status == "passed"]
        print(f"conformance {backend} quick {'/'.join(families)}: {len(ran)} passed, {len(bad)} not", flush=True)
        for c in bad:
            print("   ", c.status, c.id, c.message[:300], flush=True)
        results["conformance"][backend] = {"passed": len(ran), "failed": [f"{c.id}: {c.status}" for c in bad]}


def indexer_candidates(no_ref: bool, skipped: dict) -> list[tuple[str, object, bool]]:
    out: list[tuple[str, object, bool]] = []
    for name in ("triton", "deepgemm"):
        kern, why = registered(name, "indexer.logits_ragged", index_heads=HEADS)
        if kern is None:
            print(f"indexer {name}: skipped ({why})", flush=True)
            skipped[f"indexer/{name}"] = why
        else:
            out.append((name, kern, False))
    if not no_ref:
        out.append(("torch_reference", ReferenceIndexer(), True))
    return out


def run_indexer(results: dict, cands, fp8_tf: float, copy_gbs: float, gen: torch.Generator) -> list[tuple]:
    rows = []
    ref = ReferenceIndexer()
    for t, s in PREFILL:
        a = prefill_inputs(t, s, gen)
        want = ref.logits_ragged(a["q8"], a["w"], a["k8"], a["k_scale"], a["ks"], a["ke"])
        for name, kern, slow in cands:
            if slow and (t, s) != PREFILL[0]:
                continue  # the slow reference: the smallest shape only (keeps the script under 2 minutes)
            fn = lambda k=kern, a=a: k.logits_ragged(a["q8"], a["w"], a["k8"], a["k_scale"], a["ks"], a["ke"])  # noqa: E731
            err, same = logits_error(fn(), want)
            ms = bench_ms(fn, slow=slow)
            tf = FLOPS_PER_PAIR * t * s / (ms / 1e3) / 1e12
            r = {"kind": "prefill", "shape": f"{t}x{s}", "backend": name, "ms": ms, "tflops": tf,
                 "pct_fp8": 100 * tf / fp8_tf, "max_rel_err": err, "inf_pattern_ok": same}
            print(r, flush=True)
            rows.append(r)
        del a, want
    for batch, ctx in DECODE:
        a = decode_inputs(batch, ctx, 1, gen)
        want = ref.logits_paged(a["q8"], a["w"], a["cache"], a["lens"], a["table"], a["max_len"])
        for name, kern, slow in cands:
            if slow and batch != 1:
                continue  # the slow reference: batch 1 only
            if name != "torch_reference":
                k2, why = registered(name, "indexer.logits_paged", index_heads=HEADS, page_size=64, decode_queries=1)
                if k2 is None:
                    print(f"decode {name}: skipped ({why})", flush=True)
                    continue
            fn = lambda k=kern, a=a: k.logits_paged(a["q8"], a["w"], a["cache"], a["lens"], a["table"], a["max_len"])  # noqa: E731
            err, same = logits_error(fn(), want)
            ms = bench_ms(fn, slow=slow)
            gbs = batch * ctx * 132 / (ms / 1e3) / 1e9
            r = {"kind": "decode", "shape": f"b{batch}x{ctx}", "backend": name, "ms": ms, "gbs": gbs,
                 "pct_copy": 100 * gbs / copy_gbs, "max_rel_err": err, "inf_pattern_ok": same}
            print(r, flush=True)
            rows.append(r)
        del a, want
    results["indexer"] = rows
    return rows


def flaggems_topk(skipped: dict):
    """FlagGems' top-k (the carried optional peer), or None with the reason in ``skipped``."""
    try:
        import flag_gems

        fg = getattr(flag_gems, "topk", None) or getattr(getattr(flag_gems, "ops", None), "topk", None)
        if fg is None:
            raise AttributeError("flag_gems has no topk")
        return fg
    except Exception as exc:  # optional peer
        print(f"topk flaggems: skipped ({type(exc).__name__}: {exc})", flush=True)
        skipped["topk/flaggems"] = f"{type(exc).__name__}: {exc}"
        return None


def topk_candidates(no_ref: bool, skipped: dict, flaggems: bool = False) -> list[Candidate]:
    out = []
    kern, why = registered("triton", "topk.topk", k=TOPK)
    if kern is None:
        print(f"topk triton: skipped ({why})", flush=True)
        skipped["topk/triton"] = why
    else:
        out.append(Candidate("triton", lambda a, k=kern: k.topk(a["x"], a["s"], a["e"], TOPK)))
    out.append(Candidate("torch.topk", lambda a: torch.topk(a["x"], TOPK, dim=1).indices.to(torch.int32)))
    if flaggems:
        fg = flaggems_topk(skipped)
        if fg is not None:
            out.append(Candidate("flaggems", lambda a: fg(a["x"], TOPK, dim=1)[1].to(torch.int32)))
    else:
        skipped["topk/flaggems"] = "not asked for (--flaggems: its first calls autotune for minutes per shape)"
    if not no_ref:
        out.append(Candidate("torch_reference", lambda a: ReferenceTopK().topk(a["x"], a["s"], a["e"], TOPK), True))
    return out


def run_topk(results: dict, cands: list[Candidate], gen: torch.Generator) -> list[dict]:
    rows = []
    for r_count, length in TOPK_SHAPES:
        for pattern in PATTERNS:
            x = topk_logits(r_count, length, pattern, gen)
            a = {"x": x, "s": torch.zeros(r_count, dtype=torch.int32, device="cuda"),
                 "e": torch.full((r_count,), length, dtype=torch.int32, device="cuda")}
            ref = ReferenceTopK().topk(x, a["s"], a["e"], TOPK)
            for c in cands:
                if c.slow and pattern != PATTERNS[0]:
                    continue  # the slow reference is timed once per shape (its time does not depend on the data)
                got = c.fn(a)
                agree, same = topk_agreement(got, ref, x)
                r = {"shape": f"{r_count}x{length}", "pattern": pattern, "backend": c.name,
                     "ms": bench_ms(lambda c=c, a=a: c.fn(a), slow=c.slow), "set_agreement": agree, "rows_exact": same}
                if c.name == "triton" and pattern == "tied":
                    r["deterministic_20"] = all(torch.equal(c.fn(a), got) for _ in range(20))
                print(r, flush=True)
                rows.append(r)
    results["topk"] = rows
    return rows


def run_prefill_128k(results: dict, skipped: dict, gen: torch.Generator) -> list[dict]:
    """One layer's selection for a 128K-token prompt (causal windows) through select_topk_ragged."""
    from dsa_runtime.model.index_select import bytes_per_logit, select_topk_ragged

    n = PREFILL_TOKENS
    topk_kern, why = registered("triton", "topk.topk", k=TOPK)
    topk_name = "triton" if topk_kern is not None else "torch.topk adapter"
    topk_kern = topk_kern or TorchTopK()
    rows = []
    for name in ("deepgemm", "triton"):
        idx_kern, why = registered(name, "indexer.logits_ragged", index_heads=HEADS)
        if idx_kern is None:
            print(f"prefill 128K {name}: skipped ({why})", flush=True)
            skipped[f"prefill128k/{name}"] = why
            continue
        q8 = (torch.randn(n, HEADS, 128, generator=gen, device="cuda") * 32).to(torch.float8_e4m3fn)
        w = torch.randn(n, HEADS, generator=gen, device="cuda") * 1e-5
        k8 = (torch.randn(n, 128, generator=gen, device="cuda") * 32).to(torch.float8_e4m3fn)
        k_scale = torch.exp2(torch.rand(n, generator=gen, device="cuda") * 6 - 10)
        ks = torch.zeros(n, dtype=torch.int32, device="cuda")
        ke = torch.arange(1, n + 1, dtype=torch.int32, device="cuda")
        kernels = types.SimpleNamespace(indexer=idx_kern, topk=topk_kern)
        # The budget's per-logit constant models the reference's workspace (352 B at 64 heads); GPU kernels
        # keep ~4-12 B per logit, so this budget gives chunks of ~48M logits (192 MiB of fp32) beside the
        # 1 GiB int32 output.
        budget = (48 << 20) * bytes_per_logit(HEADS)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = select_topk_ragged(kernels, q8, w, k8, k_scale, ks, ke, TOPK, budget_bytes=budget)
        end.record()
        end.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        ok_rows = bool(((out[:TOPK] >= 0).sum(dim=1) == torch.arange(1, TOPK + 1, device="cuda")).all())
        r = {"indexer": name, "topk": topk_name, "tokens": n, "ms": start.elapsed_time(end),
             "peak_extra_gib": peak / 2**30, "output_gib": out.numel() * 4 / 2**30,
             "under_2gib": peak < 2 * 2**30, "short_rows_ok": ok_rows,
             "tflops": FLOPS_PER_PAIR * n * (n + 1) / 2 / (start.elapsed_time(end) / 1e3) / 1e12}
        print(r, flush=True)
        rows.append(r)
        del q8, w, k8, k_scale, out
        torch.cuda.empty_cache()
    results["prefill_128k"] = rows
    return rows


def _table(info: dict, ceilings: dict, idx_rows: list[dict], topk_rows: list[dict], pre_rows: list[dict]) -> None:
    print(f"\n== selection on {info['gpu']} (torch {info['torch']}, triton {info['triton']}, CUDA {info['cuda']})")
    print(f"ceilings: copy {ceilings['copy_gbs']:.0f} GB/s, fp8 _scaled_mm 8192^3 {ceilings['fp8_tflops']:.0f} TFLOP/s")
    print(f"{'indexer':<9}{'shape':<14}{'backend':<17}{'ms':>9}{'TFLOP/s':>9}{'%fp8':>7}{'GB/s':>8}{'%copy':>7}"
          f"{'max err':>10}{'-inf ok':>8}")
    for r in idx_rows:
        print(f"{r['kind']:<9}{r['shape']:<14}{r['backend']:<17}{r['ms']:>9.3f}{r.get('tflops', 0):>9.0f}"
              f"{r.get('pct_fp8', 0):>7.1f}{r.get('gbs', 0):>8.0f}{r.get('pct_copy', 0):>7.1f}"
              f"{r['max_rel_err']:>10.2e}{'yes' if r['inf_pattern_ok'] else 'NO':>8}")
    print(f"\n{'top-k 2048':<12}{'pattern':<9}{'backend':<17}{'ms':>9}{'set agree':>11}{'rows exact':>12}{'det x20':>9}")
    for r in topk_rows:
        det = {True: "yes", False: "NO"}.get(r.get("deterministic_20"), "")
        print(f"{r['shape']:<12}{r['pattern']:<9}{r['backend']:<17}{r['ms']:>9.3f}{r['set_agreement']:>11.4f}"
              f"{r['rows_exact']:>12.4f}{det:>9}")
    for r in pre_rows:
        print(f"\n128K-token prefill selection, one layer ({r['indexer']} indexer + {r['topk']}): {r['ms']:.0f} ms, "
              f"{r['tflops']:.0f} TFLOP/s overall, peak extra {r['peak_extra_gib']:.2f} GiB "
              f"(output {r['output_gib']:.2f} GiB) -> {'under' if r['under_2gib'] else 'OVER'} 2 GiB")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "selection.json"))
    ap.add_argument("--no-reference", action="store_true", help="skip the (slow) reference-backend timings")
    ap.add_argument("--skip-prefill-128k", action="store_true")
    ap.add_argument("--skip-conformance", action="store_true")
    ap.add_argument("--skip-indexer", action="store_true", help="top-k and the 128K prefill only")
    ap.add_argument("--flaggems", action="store_true",
                    help="time FlagGems' top-k too (carried flag_gems; its autotuning took over 100 s at 64 x 32K)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/selection.py needs a CUDA GPU", file=sys.stderr)
        return 2
    info = {**device_info(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv)}
    print(info, flush=True)
    results: dict = {"info": info, "conformance": {}, "skipped": {}}
    if not args.skip_conformance:
        conformance(results)
    ceilings = {"copy_gbs": copy_ceiling_gbs(), "fp8_tflops": fp8_matmul_ceiling_tflops()}
    results["ceilings"] = ceilings
    print(f"ceilings: {ceilings}", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    idx_rows = [] if args.skip_indexer else run_indexer(
        results, indexer_candidates(args.no_reference, results["skipped"]), ceilings["fp8_tflops"],
        ceilings["copy_gbs"], gen)
    write_json(args.out, results)
    topk_rows = run_topk(results, topk_candidates(args.no_reference, results["skipped"], args.flaggems), gen)
    write_json(args.out, results)
    pre_rows = [] if args.skip_prefill_128k else run_prefill_128k(results, results["skipped"], gen)
    write_json(args.out, results)
    _table(info, ceilings, idx_rows, topk_rows, pre_rows)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
