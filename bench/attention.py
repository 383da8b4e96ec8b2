"""Sparse MLA attention benchmark on Hopper: prefill, decode and the KV store.

Subjects, each checked against the reference on the benchmark inputs before it is timed: our ``tilelang`` backend
(when TileLang is installed) and ``triton``
backend (whatever sparse_attn / kv_quant kernels it registers, bound through resolution), plain PyTorch (the
``reference`` backend on CUDA), FlagGems 5.0.2 (``flag_gems.fused.flash_mla_sparse_fwd``, when importable) and
FlashMLA (the ``flashmla_sparse`` / ``flashmla_kv`` adapters, when built). Ceilings measured in the same run:
bf16 matmul 8192^3 and a 1 GiB device copy. Cases: prefill 4096 queries over 8K / 32K keys (128 heads, k 2048);
decode batch 1/16/64/128 x contexts 8K/32K/128K x bf16/FP8 cache x 128 heads / 16 heads (TP 8), one query per
request, k 2048; KV store of 128 (a decode step) and 16384 (a prefill chunk) rows, both layouts.
FLOPs = 2*H*(576+512)*k per query token (unpadded H); decode bytes = selected rows + q/out/lse/indices.

    python bench/attention.py [--out bench/results/attention.json] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import attention_setup as S  # noqa: E402
from common import bench_ms, bf16_matmul_ceiling_tflops, copy_ceiling_gbs, device_info, write_json  # noqa: E402

from dsa_runtime.testing.compare import out_and_lse  # noqa: E402
from dsa_runtime.testing.tolerances import tolerance  # noqa: E402

SUBJECTS = ("tilelang", "triton", "torch", "flaggems", "flashmla")
SLOW_REF_S = 10.0  # a reference call slower than this is not timed (said in the table)


def attn_subjects(method: str, layout: str, needs: dict, fg: dict) -> dict[str, tuple]:
    """name -> (callable or None, note)."""
    out = {"tilelang": S.bound("tilelang", method, layout, needs), "triton": S.bound("triton", method, layout, needs),
           "torch": S.bound("reference", method, layout, needs)}
    kind = method.split(".")[1]
    if fg and (kind == "prefill" or layout == "bf16"):
        out["flaggems"] = (fg[kind], "")
    else:
        out["flaggems"] = (None, "no FP8 sparse decode in FlagGems" if fg else "flag_gems not importable")
    lib = "flashmla_sparse" if kind == "prefill" else "flashmla_kv"
    out["flashmla"] = S.bound(lib, method, layout, needs)
    return out


def judge(got, want) -> str | None:
    return out_and_lse(got[0], got[1], want[0], want[1], tolerance("sparse_attn.out"), tolerance("sparse_attn.lse"))


def measure(case: dict, call: dict[str, tuple], run, want_of, rows: list, *, work: float, nbytes: float,
            ceil: dict) -> None:
    """Check every subject on ``case`` inputs, then time the correct ones; appends one row per subject."""
    want, ref_s = None, 0.0
    fn_ref = call["torch"][0]
    if fn_ref is not None:
        t0 = time.perf_counter()
        try:
            want = want_of(fn_ref)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory: the others run unchecked, said in the note
            call = {**call, "torch": (None, f"reference failed: {type(exc).__name__}: {str(exc)[:120]}")}
        ref_s = time.perf_counter() - t0
    times: dict[str, float] = {}
    for name in SUBJECTS:
        fn, note = call.get(name, (None, "not run"))
        row = {**case, "subject": name, "ms": None, "note": note if fn is None else ""}
        if fn is not None:
            try:
                problem = None if name == "torch" else want_of(fn, check=want) if want is not None else None
                row["checked"] = want is not None
                if problem:
                    row["note"] = f"WRONG: {problem[:160]}"
                elif name == "torch" and ref_s > SLOW_REF_S:
                    row["note"] = f"not timed: one call took {ref_s:.1f} s"
                else:
                    row["ms"] = bench_ms(lambda fn=fn: run(fn), slow=(name == "torch"))
                    times[name] = row["ms"]
            except Exception as exc:  # noqa: BLE001 - one failing subject must not stop the run
                row["note"] = f"error: {type(exc).__name__}: {str(exc)[:160]}"
        rows.append(row)
    for row in rows[-len(SUBJECTS):]:
        ms = row["ms"]
        if ms is None:
            continue
        row["tflops"] = work / ms / 1e9 if work else None
        row["pct_bf16"] = 100 * row["tflops"] / ceil["bf16_tflops"] if work else None
        row["gbs"] = nbytes / ms / 1e6 if nbytes else None
        row["pct_copy"] = 100 * row["gbs"] / ceil["copy_gbs"] if nbytes else None
        row["x_torch"] = times["torch"] / ms if "torch" in times else None
        row["x_flashmla"] = times["flashmla"] / ms if "flashmla" in times else None


def attn_runner(method: str, inputs: dict, layout: str):
    def run(fn):
        if method == "sparse_attn.prefill":
            return fn(inputs["q"], inputs["kv"], inputs["indices"], S.SM_SCALE)
        return fn(inputs["q"], inputs["cache"], inputs["indices"], S.SM_SCALE, layout=layout)

    def want_of(fn, check=None):
        got = run(fn)
        return judge(got, check) if check is not None else got

    return run, want_of


def store_runner(inputs: dict, layout: str):
    def run(fn):
        fn(inputs["cache"], inputs["slots"], inputs["c"], inputs["k_pe"], layout=layout)
        return inputs["cache"]

    def want_of(fn, check=None):
        inputs["cache"].zero_()
        got = run(fn).clone()
        if check is None:
            return got
        a, b = got.view(torch.uint8).reshape(-1, got.shape[-1] * got.element_size()), check.view(torch.uint8).reshape(
            -1, got.shape[-1] * got.element_size())
        if layout == "bf16":
            return None if torch.equal(a, b) else "stored bf16 rows differ from the reference"
        # fp8_656: scales and k_pe exact; an e4m3 code may differ by one step (a rounding tie), as the kit allows
        if not torch.equal(a[:, 512:], b[:, 512:]):
            return "stored scales or k_pe differ from the reference"
        step = (a[:, :512].int() - b[:, :512].int()).abs().max()
        return None if int(step) <= 1 else f"stored e4m3 codes differ by up to {int(step)} steps"

    return run, want_of


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "attention.json"))
    ap.add_argument("--quick", action="store_true", help="one prefill, decode at batch 64 only, 8K/32K contexts")
    args = ap.parse_args()
    started = time.perf_counter()
    info = device_info()
    ceil = {"bf16_tflops": bf16_matmul_ceiling_tflops(), "copy_gbs": copy_ceiling_gbs()}
    print(f"{info['gpu']}: bf16 matmul 8192^3 {ceil['bf16_tflops']:.0f} TFLOP/s, copy {ceil['copy_gbs']:.0f} GB/s",
          flush=True)
    fg, fg_note = S.flaggems()
    print(f"FlagGems: {fg_note}", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows: list[dict] = []

    for n_kv in (8192,) if args.quick else (8192, 32768):
        inputs = S.prefill_inputs(4096, n_kv, 128, 2048, gen)
        needs = {"heads": 128, "k": 2048, "page_size": S.PAGE}
        run, want_of = attn_runner("sparse_attn.prefill", inputs, "bf16")
        case = {"kind": "prefill", "case": f"T4096 S{n_kv // 1024}K h128 k2048 bf16"}
        measure(case, attn_subjects("sparse_attn.prefill", "bf16", needs, fg), run, want_of, rows,
                work=S.flops(4096, 128, 2048), nbytes=0, ceil=ceil)
        print(f"  prefill S{n_kv} done ({time.perf_counter() - started:.0f} s)", flush=True)
        del inputs

    for context in (8192, 32768) if args.quick else (8192, 32768, 131072):
        for layout in ("bf16", "fp8_656"):
            cache = S.cache_pool(context, layout, gen)
            for batch in (64,) if args.quick else (1, 16, 64, 128):
                for heads in (128, 16):
                    inputs = S.decode_inputs(cache, context, batch, heads, 2048, gen)
                    needs = {"heads": heads, "k": 2048, "page_size": S.PAGE, "decode_queries": 1}
                    run, want_of = attn_runner("sparse_attn.decode", inputs, layout)
                    case = {"kind": "decode", "case": f"b{batch} ctx{context // 1024}K h{heads} {layout}"}
                    measure(case, attn_subjects("sparse_attn.decode", layout, needs, fg), run, want_of, rows,
                            work=S.flops(batch, heads, 2048), nbytes=S.decode_bytes(batch, heads, 2048, layout),
                            ceil=ceil)
            del cache
            print(f"  decode ctx {context} {layout} done ({time.perf_counter() - started:.0f} s)", flush=True)

    for n in (128, 16384):
        for layout in ("bf16", "fp8_656"):
            inputs = S.store_inputs(n, layout, gen)
            run, want_of = store_runner(inputs, layout)
            call = {"triton": S.bound("triton", "kv_quant.store_mla", layout, {"page_size": S.PAGE}),
                    "torch": S.bound("reference", "kv_quant.store_mla", layout, {"page_size": S.PAGE}),
                    "flaggems": (None, "no KV store in FlagGems"), "flashmla": (None, "no KV store in FlashMLA"),
                    "tilelang": (None, "no KV store in the tilelang backend")}
            measure({"kind": "store", "case": f"store_mla n{n} {layout}"}, call, run, want_of, rows,
                    work=0, nbytes=S.store_bytes(n, layout), ceil=ceil)

    _table(rows, info, ceil)
    write_json(args.out, {"info": info, "ceilings": ceil, "rows": rows,
                          "command": " ".join(["python", *sys.argv]), "flaggems": fg_note,
                          "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                          "seconds": round(time.perf_counter() - started, 1)})
    print(f"wrote {args.out} ({time.perf_counter() - started:.0f} s)")
    return 0


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _table(rows: list[dict], info: dict, ceil: dict) -> None:
    print(f"\n{info['gpu']} (torch {info['torch']}, triton {info['triton']}): bf16 ceiling "
          f"{ceil['bf16_tflops']:.0f} TFLOP/s, copy ceiling {ceil['copy_gbs']:.0f} GB/s")
    print(f"{'case':<34} {'subject':<9} {'ms':>8} {'TFLOP/s':>8} {'%bf16':>6} {'GB/s':>7} {'%copy':>6} "
          f"{'x torch':>8} {'x FlashMLA':>10}  note")
    for r in rows:
        print(f"{r['case']:<34} {r['subject']:<9} {_fmt(r['ms'], '.4f'):>8} {_fmt(r.get('tflops'), '.0f'):>8} "
              f"{_fmt(r.get('pct_bf16'), '.0f'):>6} {_fmt(r.get('gbs'), '.0f'):>7} {_fmt(r.get('pct_copy'), '.0f'):>6} "
              f"{_fmt(r.get('x_torch'), '.2f'):>8} {_fmt(r.get('x_flashmla'), '.2f'):>10}  {r['note'][:110]}")


if __name__ == "__main__":
    raise SystemExit(main())
