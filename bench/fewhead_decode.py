"""Few-head sparse MLA decode: 8 / 16 / 32 heads per rank, both cache layouts, 1 or 4 queries
per request, against the head-blocked kernels and padded FlashMLA, as CUDA-graph replays in one run.

    python bench/fewhead_decode.py [--quick] [--sweep] [--json PATH]

Every subject is checked against the reference backend (on CUDA) on the bench inputs before it is timed. Inputs:
k 2048 random slots of each request's own 32K context (pages of 64, ~1% ``-1``), random q. Bytes = the selected
rows (656 B fp8_656, 1152 B bf16) + q, out, lse and indices; "% copy" = those bytes per second against a device
copy measured in the same run (bytes read + written). Two times per subject: ``ms``, one call per replayed graph
(each replay also pays the graph's launch, about 4.5 us on an H200), and ``layer ms``, the time per call in one
graph of :data:`LAYERS` calls with their own inputs (consecutive calls read other requests' contexts, so no call
finds its rows in the L2), which is how a captured decode step runs the attention of its layers; "% copy" and
"vs FlashMLA" use ``layer ms``. Subjects:

* ``fewhead``: :func:`...sparse_mla_decode_fewhead.decode_fewhead` (default, and with ``--sweep`` every
  candidate of :data:`SWEEP`);
* ``fewhead cuda``: the CUDA C++ kernel the Triton backend runs for ``fp8_656`` at up to 16 heads, and at 32 as two
  head groups, when NVRTC is found (:func:`...cuda.fewhead_fp8.decode_fewhead_fp8_cuda`);
* ``headblock``: the head-blocked kernels the backend ran before (``mla_fp8_decode`` / ``sparse_mla_decode_bf16``
  with their default configs);
* ``flashmla``: FlashMLA's FP8 decode through our ``flashmla_kv`` adapter (heads padded to 64), when built;
* ``tilelang``: our TileLang sparse MLA decode (heads padded to 64), when TileLang is importable.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention_setup import D_QK, PAGE, SM_SCALE, bound, cache_pool, decode_bytes  # noqa: E402
from common import copy_ceiling_gbs, device_info, graph_layers_ms, graph_ms, write_json  # noqa: E402

from dsa_runtime.plugins.cuda_hopper.cuda import fewhead_fp8, nvrtc  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.fewhead_plan import FewHeadConfig, default_config  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.mla_fp8_decode import decode_fp8_656  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_decode_bf16 import decode_bf16  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_decode_fewhead import decode_fewhead  # noqa: E402
from dsa_runtime.testing.compare import out_and_lse  # noqa: E402
from dsa_runtime.testing.tolerances import tolerance  # noqa: E402

K, CONTEXT = 2048, 32768
LAYERS = 16  # calls per graph for the per-layer time
F = FewHeadConfig
SWEEP: tuple[FewHeadConfig, ...] = (
    F(splits=2), F(splits=4), F(splits=6), F(fused=True), F(32, 4, 4), F(32, 4, 2), F(64, 4, 3), F(64, 8, 3),
    F(16, 4, 4), F(16, 4, 6),
    F(variant="fold"), F(32, 4, 4, "fold"), F(64, 4, 3, "fold"), F(16, 4, 4, "fold"), F(64, 8, 3, "fold"),
    F(variant="fold", fused=True),
)


def inputs(cache: torch.Tensor, batch: int, n_q: int, heads: int, gen: torch.Generator, first: int = 0) -> dict:
    """k random slots of each request's own context (each query its own set), ~1% -1; random q. Request r reads
    context ``first + r`` of the pool (wrapping around)."""
    rows = cache.shape[0] * PAGE
    base = ((torch.arange(batch, device="cuda") + first) * CONTEXT) % rows
    idx = base[:, None, None] + torch.randint(0, CONTEXT, (batch, n_q, K), device="cuda", generator=gen)
    idx = torch.where(torch.rand(batch, n_q, K, device="cuda", generator=gen) < 0.01, -1, idx).to(torch.int32)
    q = torch.randn(batch, n_q, heads, D_QK, device="cuda", generator=gen, dtype=torch.bfloat16)
    return {"q": q, "cache": cache, "indices": idx}


def layer_inputs(cache: torch.Tensor, batch: int, n_q: int, heads: int, gen: torch.Generator) -> list[dict]:
    """:data:`LAYERS` input sets of :func:`inputs`, one per layer of a decode step. Consecutive sets read the two
    halves of the pool in turn, so no call finds the previous call's rows in the L2."""
    return [inputs(cache, batch, n_q, heads, gen, first=(i % 2) * batch) for i in range(LAYERS)]


def subjects(layout: str, heads: int, n_q: int, sweep: bool, merge: bool = False) -> dict:
    out = {"fewhead": lambda a: decode_fewhead(a["q"], a["cache"], a["indices"], SM_SCALE, layout=layout)}
    if layout == "fp8_656" and fewhead_fp8.supported(heads, 512):
        if nvrtc.available():
            out["fewhead cuda"] = lambda a: fewhead_fp8.decode_fewhead_fp8_cuda(a["q"], a["cache"], a["indices"],
                                                                             SM_SCALE)
        else:
            print("  fewhead cuda: NVRTC not found", flush=True)
    base = default_config(layout, heads)
    for cfg in (SWEEP if sweep else ()) + ((replace(base, fused=not base.fused),) if merge else ()):
        out[f"fewhead {cfg.label}"] = (lambda c: lambda a: decode_fewhead(
            a["q"], a["cache"], a["indices"], SM_SCALE, layout=layout, config=c))(cfg)
    needs = {"heads": heads, "k": K, "page_size": PAGE, "decode_queries": n_q}
    fn_tl, note_tl = bound("tilelang", "sparse_attn.decode", layout, needs)
    if fn_tl is not None:
        out["tilelang (padded)"] = lambda a: fn_tl(a["q"], a["cache"], a["indices"], SM_SCALE, layout=layout)
    else:
        print(f"  tilelang: {note_tl[:150]}", flush=True)
    if layout == "fp8_656":
        out["headblock"] = lambda a: decode_fp8_656(a["q"], a["cache"], a["indices"], SM_SCALE)
        fn, note = bound("flashmla_kv", "sparse_attn.decode", layout, needs)
        if fn is not None:
            out["flashmla (padded)"] = lambda a: fn(a["q"], a["cache"], a["indices"], SM_SCALE, layout=layout)
        else:
            print(f"  flashmla: {note}", flush=True)
    else:
        out["headblock"] = lambda a: decode_bf16(a["q"], a["cache"], a["indices"], SM_SCALE)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="batch 64 only")
    ap.add_argument("--sweep", action="store_true", help=f"also every candidate of SWEEP ({len(SWEEP)})")
    ap.add_argument("--merge", action="store_true",
                    help="16 heads only, each default also with the other merge (in the launch / second launch)")
    ap.add_argument("--json", default="bench/results/fewhead_decode.json")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("fewhead_decode.py needs a CUDA device")
    info = device_info()
    copy = copy_ceiling_gbs()
    print(f"{info['gpu']}: copy {copy:.0f} GB/s", flush=True)
    ref = {lay: bound("reference", "sparse_attn.decode", lay, {"heads": 16, "k": K, "page_size": PAGE})[0]
           for lay in ("fp8_656", "bf16")}
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = [(h, 1, 64) for h in (8, 16, 32)] + [(16, 4, 64)]
    if not args.quick:
        shapes += [(16, 1, 1), (16, 1, 128)]
    if args.merge:
        shapes = [(16, 1, 1), (16, 1, 8), (16, 1, 64), (16, 4, 64), (16, 1, 128)]
    rows = []
    for layout in ("fp8_656", "bf16"):
        cache = cache_pool(CONTEXT, layout, gen)
        for heads, n_q, batch in shapes:
            layers = layer_inputs(cache, batch, n_q, heads, gen)
            a = layers[0]
            want = ref[layout](a["q"], a["cache"], a["indices"], SM_SCALE, layout=layout)
            nbytes = decode_bytes(batch * n_q, heads, K, layout)
            floor_ms = nbytes / copy / 1e6
            for name, fn in subjects(layout, heads, n_q, args.sweep, args.merge).items():
                row = {"layout": layout, "heads": heads, "queries": n_q, "batch": batch, "subject": name,
                       "floor_ms": floor_ms}
                try:
                    got = fn(a)
                    bad = out_and_lse(got[0], got[1], want[0], want[1], tolerance("sparse_attn.out"),
                                      tolerance("sparse_attn.lse"))
                    row["ms"] = None if bad else graph_ms(lambda fn=fn, a=a: fn(a))
                    row["layer_ms"] = None if bad else graph_layers_ms([lambda fn=fn, x=x: fn(x) for x in layers])
                    row["note"] = f"WRONG: {bad[:120]}" if bad else ""
                except Exception as exc:  # noqa: BLE001 - reported per subject; the others still run
                    row["ms"] = row["layer_ms"] = None
                    row["note"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
                if row["layer_ms"]:
                    row["pct_copy"] = 100 * floor_ms / row["layer_ms"]
                rows.append(row)
                ms = f"{row['ms']:.4f} / {row['layer_ms']:.4f}" if row["layer_ms"] else "-"
                pct = f"{row.get('pct_copy', 0):.0f}%" if row["layer_ms"] else ""
                print(f"  {layout:8s} h{heads:<3d} q{n_q} b{batch:<4d} {name:38s} {ms:>17s} ms {pct:>5s} {row['note']}",
                      flush=True)
            del layers
        del cache
        torch.cuda.empty_cache()

    print(f"\n(one call per graph / per layer of a {LAYERS}-call graph; % copy and vs FlashMLA per layer)")
    print("| layout | heads | queries | batch | floor ms | best fewhead | ms | layer ms | % copy | "
          "headblock layer ms | FlashMLA padded ms | layer ms | best vs FlashMLA | TileLang padded layer ms |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for layout in ("fp8_656", "bf16"):
        for heads, n_q, batch in shapes:
            grp = [r for r in rows if (r["layout"], r["heads"], r["queries"], r["batch"]) == (layout, heads, n_q, batch)]
            few = [r for r in grp if r["subject"].startswith("fewhead") and r["layer_ms"]]  # timed and correct
            best = min(few, key=lambda r: r["layer_ms"]) if few else None
            other = {r["subject"]: r["layer_ms"] for r in grp}
            fm = other.get("flashmla (padded)")
            fm_one = {r["subject"]: r["ms"] for r in grp}.get("flashmla (padded)")
            def cell(value: float | None, fmt: str = ".4f", unit: str = "") -> str:  # "-": not run or failed
                return f"{value:{fmt}}{unit}" if value else "-"

            print(f"| {layout} | {heads} | {n_q} | {batch} | {grp[0]['floor_ms']:.4f} | "
                  f"{best['subject'] if best else '-'} | {cell(best and best['ms'])} | "
                  f"{cell(best and best['layer_ms'])} | "
                  f"{cell(best and best['pct_copy'], '.0f', '%')} | {cell(other.get('headblock'))} | "
                  f"{cell(fm_one)} | {cell(fm)} | {cell(fm and best and fm / best['layer_ms'], '.2f', 'x')} | "
                  f"{cell(other.get('tilelang (padded)'))} |")
    from dsa_runtime.plugins.cuda_hopper.triton.fewhead_plan import _RESIDENT

    print("programs per SM by compiled kernel:", {str(k[1:]): v for k, v in _RESIDENT.items()})
    write_json(args.json, {"device": info, "copy_gbs": copy, "k": K, "context": CONTEXT, "layers": LAYERS,
                           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "rows": rows})
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
