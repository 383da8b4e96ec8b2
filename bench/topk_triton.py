"""Top-k benchmark of the cuda_hopper ``triton`` backend: radix select vs torch.topk.

Correctness first, for every candidate config: the quick top-k conformance cases (default config, through
the registered backend), then exact selection equality with the reference (``ReferenceTopK``: ties to the
lower column, NaN as ``-inf``) on random, tied, few-valued, mostly ``-inf`` and NaN rows, ragged windows
and short windows, the fused transform against topk-then-transform, 20-run determinism, and one CUDA-graph
capture. A config that fails is reported and left out of the timings (never a crash). Then the timed shapes
(k = 2048): 64 x 32K, 1 x 128K, 64 x 128K, 4096 x 8K with random, tied, mostly ``-inf`` and sparse (1000 finite) rows, eager and
CUDA-graph replay, beside plain ``torch.topk`` and the reference backend, with a device-copy ceiling (the
time to read the logits once at copy bandwidth). Prints a table and writes JSON.

    python bench/topk_triton.py [--out bench/results/topk_triton.json] [--quick] [--configs cand,b8_full]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_ms, copy_ceiling_gbs, device_info, graph_ms, kernel_times_us, write_json  # noqa: E402

from dsa_runtime.plugins.cuda_hopper.triton.topk import SamplePlan, TopKConfig, TritonTopK, split_for  # noqa: E402
from dsa_runtime.reference.topk import ReferenceTopK  # noqa: E402
from dsa_runtime.testing import run_conformance  # noqa: E402

K = 2048
# The default first: rows <= 32K take the register-resident bisection ("bisect*"), longer rows the sampled-bound
# search with the register search behind it ("sample*"; "no_sample" without it); "cand*" force the
# candidate-buffer search (8-bit passes) for every row, "*_full" the full radix search.
NO_BISECT = {"bisect": False}
CONFIGS = {
    "bisect": TopKConfig(),
    "bisect_k32": TopKConfig(bisect_keys_per_thread=32),
    "bisect_mem": TopKConfig(bisect_reg_write=False),
    "bisect_1prog": TopKConfig(bisect_split=1),
    "bisect_s4": TopKConfig(bisect_split=4),
    "bisect_2lvl": TopKConfig(bisect_two_level=True),
    "no_sample": TopKConfig(sample=None),  # the register search alone for rows over 32K (the default until 2026-11-26)
    "sample_fused": TopKConfig(sample=SamplePlan(fused_sample=True)),
    "sample_s1": TopKConfig(sample=SamplePlan(slices=1)),  # one scan program per row (many rows, before 2026-11-26)
    "sample_s4": TopKConfig(sample=SamplePlan(slices=4)),
    "sample_s16": TopKConfig(sample=SamplePlan(slices=16)),
    "sample_k4096": TopKConfig(sample=SamplePlan(sample=4096)),
    "sample_st3": TopKConfig(sample=SamplePlan(stages=3)),
    "sample_w8": TopKConfig(sample=SamplePlan(block=4096, warps=8)),
    "sample_nopdl": TopKConfig(sample=SamplePlan(pdl=False)),  # every launch after the previous one (before 2026-11-26)
    "sample_triton_scan": TopKConfig(sample=SamplePlan(cuda_scan=False)),  # the Triton scan (before 2026-11-27)
    "cand": TopKConfig(**NO_BISECT),
    "cand_blk4096": TopKConfig(block=4096, split_block=4096, **NO_BISECT),
    "cand_blk8192_w16": TopKConfig(block=8192, warps=16, split_block=4096, split_warps=8, **NO_BISECT),
    "cand_blk1024_w4": TopKConfig(block=1024, warps=4, split_block=1024, split_warps=4, **NO_BISECT),
    "cand_slice4k": TopKConfig(min_slice=4096, **NO_BISECT),
    "cand_slice2k": TopKConfig(min_slice=2048, split_block=1024, split_warps=4, **NO_BISECT),
    "cand_slice16k": TopKConfig(min_slice=16384, **NO_BISECT),
    "cand_fin2048_w8": TopKConfig(finish_block=2048, finish_warps=8, **NO_BISECT),
    "cand_fin4096_w16": TopKConfig(finish_block=4096, finish_warps=16, **NO_BISECT),
    "cand_cap8k": TopKConfig(cand_cap=8192, **NO_BISECT),
    "b8_full": TopKConfig(candidates=False, **NO_BISECT),
    "b11_full": TopKConfig(bits=11, candidates=False, **NO_BISECT),
}
# Left out of --quick: b11 measured slow on the H100 (2048-bin histograms); the candidate-search variants that
# differ only for rows <= 32K (now the bisection's) or lost every shape in the 2026-11-23 sweep.
QUICK_SKIP = ("sample_s1", "sample_w8", "sample_k4096", "sample_s4", "b11_full", "cand_blk4096", "cand_slice2k", "cand_blk1024_w4", "cand_fin2048_w8", "cand_blk8192_w16", "cand_fin4096_w16", "cand_cap8k", "cand_slice16k")
DEFAULT = "bisect"
SHAPES = [(64, 32768), (1, 131072), (64, 131072), (256, 131072), (4096, 8192)]
KINDS = ("random", "ties", "neginf", "sparse")


def make_logits(rows: int, width: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(rows, width, generator=gen, device="cuda")
    if kind == "ties":
        return torch.floor(x * 2).clamp(-3, 3)
    if kind == "few":
        return torch.randint(-1, 2, (rows, width), generator=gen, device="cuda").float() * 0.5
    if kind == "neginf":
        return torch.where(torch.rand(rows, width, generator=gen, device="cuda") < 0.98, float("-inf"), x)
    if kind == "sparse":  # about 1000 finite logits per row, fewer than k: the rest of the top-k is -inf ties
        return torch.where(torch.rand(rows, width, generator=gen, device="cuda") < 1000 / width, x, float("-inf"))
    if kind == "nan":
        return torch.where(torch.rand(rows, width, generator=gen, device="cuda") < 0.1, float("nan"), x)
    return x


def _windows(rows: int, width: int, kind: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    if kind == "full":
        return torch.zeros(rows, dtype=torch.int32, device="cuda"), torch.full((rows,), width, dtype=torch.int32, device="cuda")
    a = torch.randint(0, width + 1, (2, rows), generator=gen, device="cuda")
    s, e = torch.minimum(a[0], a[1]), torch.maximum(a[0], a[1])
    if kind == "short":
        e = torch.minimum(e, s + torch.randint(0, K + 1, (rows,), generator=gen, device="cuda"))
    return s.to(torch.int32), e.to(torch.int32)


_INPUTS: dict[tuple, tuple[torch.Tensor, ...]] = {}


def check_config(name: str, cfg: TopKConfig, ref: ReferenceTopK, quick: bool = False) -> str | None:
    """None when every check passes, else the first failure in one line (``quick``: fewer shapes/windows)."""
    kern = TritonTopK(cfg)
    gen = torch.Generator(device="cuda").manual_seed(1)
    shapes = [(64, 32768), (3, 131072), (300, 4096), (2, 65536)]
    if quick:
        shapes = [(64, 32768), (3, 131072), (300, 8192)]
    for rows, width in shapes:
        for kind in ("random", "ties", "few", "neginf", "sparse", "nan"):
            for win in ("full", "ragged") if quick else ("full", "ragged", "short"):
                key = (quick, rows, width, kind, win)
                if key not in _INPUTS:  # the same inputs for every config: the reference runs once per input
                    x = make_logits(rows, width, kind, gen)
                    s, e = _windows(rows, width, win, gen)
                    _INPUTS[key] = (x, s, e, ref.topk(x, s, e, K))
                x, s, e, want = _INPUTS[key]
                got = kern.topk(x, s, e, K)
                if not torch.equal(got.sort(dim=1).values, want.sort(dim=1).values):
                    bad = int((got.sort(dim=1).values != want.sort(dim=1).values).any(dim=1).sum())
                    return f"{rows}x{width} {kind}/{win}: {bad} rows differ from the reference selection"
    x = make_logits(2, 131072, "ties", gen)
    s, e = _windows(2, 131072, "full", gen)
    table = torch.randperm(4096, generator=gen, device="cuda").to(torch.int32).reshape(2, 2048)
    owner = torch.tensor([1, 0], dtype=torch.int32, device="cuda")
    fused = kern.topk_transform(x, s, e, K, table, owner, 64)
    if not torch.equal(fused, ref.page_table_transform(kern.topk(x, s, e, K), table, owner, 64)):
        return "fused transform differs from topk then page_table_transform"
    for rows, width in ((64, 32768), (1, 131072)):
        x = make_logits(rows, width, "ties", gen)
        s, e = _windows(rows, width, "full", gen)
        first = kern.topk(x, s, e, K)
        if not all(torch.equal(kern.topk(x, s, e, K), first) for _ in range(19)):
            return f"{rows}x{width} ties: 20 runs are not identical"
        graph = torch.cuda.CUDAGraph()
        kern.topk(x, s, e, K)
        with torch.cuda.graph(graph):
            out = kern.topk(x, s, e, K)
        x.copy_(make_logits(rows, width, "random", gen))
        graph.replay()
        if not torch.equal(out, kern.topk(x, s, e, K)):
            return f"{rows}x{width}: CUDA-graph replay differs from eager"
    return None


def time_shape(rows: int, width: int, kind: str, configs: dict[str, TopKConfig], ref: ReferenceTopK | None,
               gbs: float) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(2)
    x = make_logits(rows, width, kind, gen)
    s, e = _windows(rows, width, "full", gen)
    row = {
        "shape": f"{rows}x{width}", "kind": kind,
        "copy_ceiling_ms": rows * width * 4 / gbs / 1e6,  # one read of the logits at copy bandwidth
        "torch_topk_ms": bench_ms(lambda: torch.topk(x, K, dim=1, sorted=False)),
        "reference_ms": bench_ms(lambda: ref.topk(x, s, e, K), slow=True) if ref is not None else float("nan"),
        "configs": {},
    }
    for name, cfg in configs.items():
        kern = TritonTopK(cfg)
        try:
            row["configs"][name] = {
                "split": split_for(rows, width, cfg, torch.cuda.get_device_properties(0).multi_processor_count),
                "eager_ms": bench_ms(lambda kern=kern: kern.topk(x, s, e, K)),
                "graph_ms": graph_ms(lambda kern=kern: kern.topk(x, s, e, K)),
            }
        except Exception as exc:  # reported, not fatal
            row["configs"][name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    return row


def _table(rows: list[dict], names: list[str]) -> None:
    head = f"{'shape':>12} {'kind':>7} {'copy':>7} {'torch':>7} {'ref':>7} | " + " ".join(f"{n[:16]:>16}" for n in names)
    print("\nms (eager / graph); copy = one read of the logits at copy bandwidth\n" + head)
    for r in rows:
        cells = []
        for n in names:
            c = r["configs"].get(n, {})
            if not c:
                cells.append(f"{'-':>16}")
            elif "error" in c:
                cells.append(f"{'ERR':>16}")
            else:
                cells.append(f"{c['eager_ms']:.3f}/{c['graph_ms']:.3f}s{c['split']}".rjust(16))
        print(f"{r['shape']:>12} {r['kind']:>7} {r['copy_ceiling_ms']:7.3f} {r['torch_topk_ms']:7.3f} {r['reference_ms']:7.2f} | " + " ".join(cells))


def profile_kernels(names: list[str], reps: int = 20) -> int:
    """Each config's kernels at 64 x 128K and 1 x 128K (random rows): mean device microseconds per call by
    kernel name (``common.kernel_times_us``), beside the graph replay time of the whole call."""
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown --profile configs {unknown}; valid: {', '.join(CONFIGS)}")
    print(device_info(), flush=True)
    gen = torch.Generator(device="cuda").manual_seed(3)
    for rows, width in ((64, 131072), (1, 131072)):
        x = make_logits(rows, width, "random", gen)
        s, e = _windows(rows, width, "full", gen)
        for name in names:
            kern = TritonTopK(CONFIGS[name])
            call = lambda kern=kern, x=x, s=s, e=e: kern.topk(x, s, e, K)  # noqa: E731
            per = kernel_times_us(call, iters=reps)
            parts = ", ".join(f"{k.split('(')[0][:28]} {v:.1f}" for k, v in per.items())
            print(f"{rows}x{width} {name}: graph {graph_ms(call) * 1e3:.1f} us, kernels {sum(per.values()):.1f} us: "
                  f"{parts}", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "topk_triton.json"))
    ap.add_argument("--quick", action="store_true",
                    help="random + tied + mostly -inf timed once each, lighter checks for non-default configs, "
                         "no reference timings, slow configs skipped (< 90 s on an H100)")
    ap.add_argument("--configs", default="", help="comma-separated config names (default: all)")
    ap.add_argument("--profile", default="", help="comma-separated config names: only their kernels' device "
                                                  "times (torch.profiler) at 64 x 128K and 1 x 128K, random rows")
    args = ap.parse_args()
    if args.profile:
        return profile_kernels([n for n in args.profile.split(",") if n])
    configs = {n: c for n, c in CONFIGS.items() if (n in args.configs.split(",") if args.configs
                                                       else not (args.quick and n in QUICK_SKIP))}
    info = device_info()
    print(info, flush=True)
    report = run_conformance("triton", full=False, families=["topk"], device="cuda", progress=False)
    bad = [c for c in report.cases if c.status != "passed"]
    print(f"conformance quick topk: {len(report.cases) - len(bad)}/{len(report.cases)} passed", flush=True)
    for c in bad:
        print(f"  {c.status} {c.id}: {c.message[:200]}")
    ref = ReferenceTopK()
    failed: dict[str, str] = {}
    for name, cfg in configs.items():
        try:
            msg = check_config(name, cfg, ref, quick=args.quick and name != DEFAULT)
        except Exception as exc:
            msg = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            traceback.print_exc()
        print(f"check {name}: {'ok' if msg is None else 'FAILED ' + msg}", flush=True)
        if msg is not None:
            failed[name] = msg
    good = {n: c for n, c in configs.items() if n not in failed}
    gbs = copy_ceiling_gbs()
    rows = []
    for r, w in SHAPES:
        for kind in KINDS:
            # --quick: every config on random rows; tied and mostly -inf rows with the default, the full 8-bit
            # search and torch only
            timed = good if kind == "random" or not args.quick else {
                n: c for n, c in good.items() if n in (DEFAULT, "cand", "b8_full", "no_sample")}
            rows.append(time_shape(r, w, kind, timed, None if args.quick else ref, gbs))
            print(f"timed {r}x{w} {kind}", flush=True)
    _table(rows, list(good))
    best = {}
    for r in rows:
        ok = {n: c["graph_ms"] for n, c in r["configs"].items() if "graph_ms" in c}
        if ok:
            best[f"{r['shape']}/{r['kind']}"] = min(ok, key=ok.get)
    print("\nbest config (graph) per shape:", best)
    write_json(args.out, {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "device": info, "k": K,
        "conformance": {"passed": len(report.cases) - len(bad), "total": len(report.cases),
                        "failures": [f"{c.id}: {c.message[:200]}" for c in bad]},
        "copy_gbs": gbs, "failed_configs": failed, "rows": rows, "best": best,
        "configs": {n: dataclasses.asdict(c) for n, c in configs.items()},
    })
    print(f"wrote {args.out}")
    return 1 if bad or failed else 0


if __name__ == "__main__":
    sys.exit(main())
