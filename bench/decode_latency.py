"""Small-batch sparse MLA decode latency beside the floors measured in the same run.

Each decode call (128 heads, k 2048, one query per request, the request's own 32K context) is checked against
the reference decode on CUDA, then timed as one call captured in a CUDA graph (``common.graph_ms``: graph launch
included, host launch overhead not), as an engine replays decode. Beside it, in the same run and the same way:

* ``launch``: a graph of one tiny kernel: what any one-kernel call costs at least;
* ``copy``: a graph copying the selected rows' bytes (``batch x k`` rows) with one device copy;
* ``read``: those bytes at the device-copy bandwidth of a 1 GiB copy (``bytes / copy GB/s``), the time a
  perfectly streamed read of the rows would take.

The batch-1 target, within 2x of ``read``, lies below ``launch``: no one-kernel call can meet it as written.
Prints a table (``x launch``, ``x copy``, ``x read``: our time over each floor) and writes JSON.

    python3 bench/decode_latency.py [--batches 1,4] [--layouts bf16,fp8_656] [--out bench/results/decode_latency.json]
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import attention_setup as S  # noqa: E402
from attention import judge  # noqa: E402
from common import copy_ceiling_gbs, device_info, graph_ms, write_json  # noqa: E402

BACKENDS = ("tilelang", "triton", "flashmla_kv")  # flashmla_kv: the fp8_656 cache only
HEADS, K, CONTEXT = 128, 2048, 32768


def floors(batch: int, layout: str, copy_gbs: float) -> dict[str, float]:
    """The launch, same-size copy and streamed-read floors in microseconds."""
    row = 2 * S.D_QK if layout == "bf16" else 656
    nbytes = batch * K * row
    one = torch.zeros(1, device="cuda")
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return {"launch": 1e3 * graph_ms(lambda: one.add_(1)), "copy": 1e3 * graph_ms(lambda: dst.copy_(src)),
            "read": nbytes / copy_gbs / 1e3, "bytes": nbytes}


def tilelang_splits(n: int):
    """The tilelang decode with ``n`` index-list splits, or (None, why not)."""
    try:
        from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_attn import (
            TileLangSparseAttn,
            tilelang_available,
        )
    except ImportError as exc:
        return None, str(exc)
    ok, why = tilelang_available()
    return (TileLangSparseAttn(decode_splits=n).decode, f"{n} splits") if ok else (None, why)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--layouts", default="bf16,fp8_656")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "decode_latency.json"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("decode_latency: needs a CUDA device", file=sys.stderr)
        return 2
    info = device_info()
    copy_gbs = copy_ceiling_gbs()
    print(f"{info['gpu']}: copy {copy_gbs:.0f} GB/s", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows: list[dict] = []
    for layout in args.layouts.split(","):
        cache = S.cache_pool(CONTEXT, layout, gen)
        needs = {"heads": HEADS, "k": K, "page_size": S.PAGE, "decode_queries": 1}
        ref, _ = S.bound("reference", "sparse_attn.decode", layout, needs)
        for batch in (int(b) for b in args.batches.split(",")):
            inputs = S.decode_inputs(cache, CONTEXT, batch, HEADS, K, gen)

            def call(fn, inputs=inputs, layout=layout):
                return fn(inputs["q"], inputs["cache"], inputs["indices"], S.SM_SCALE, layout=layout)

            want = call(ref)
            floor = floors(batch, layout, copy_gbs)
            case = f"b{batch} ctx{CONTEXT // 1024}K h{HEADS} {layout}"
            rows.append({"case": case, "subject": "floors", **floor})
            subjects = [(name, *S.bound(name, "sparse_attn.decode", layout, needs)) for name in BACKENDS]
            if batch == 1:  # the tilelang split-K planner's alternatives at one request
                subjects += [(f"tilelang/s{n}", *tilelang_splits(n)) for n in (4, 8, 32)]
            for name, fn, why in subjects:
                row = {"case": case, "subject": name, "how": why}
                if fn is not None:
                    got = call(fn)
                    bad = judge(got, want)
                    row["checked"] = bad is None
                    if bad is None:
                        us = 1e3 * graph_ms(lambda fn=fn: call(fn))
                        row.update(us=us, x_launch=us / floor["launch"], x_copy=us / floor["copy"],
                                   x_read=us / floor["read"])
                    else:
                        row["error"] = f"wrong result: {bad}"[:200]
                rows.append(row)
                print(f"  {case:26s} {name:12s} " + (f"{row['us']:7.1f} us" if "us" in row else
                      row.get("error", why)[:120]), flush=True)
        del cache
    _table(rows, info, copy_gbs)
    write_json(args.out, {"info": info, "copy_gbs": copy_gbs, "rows": rows, "command": " ".join(["python", *sys.argv]),
                          "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})
    print(f"wrote {args.out}")
    return 0


def _table(rows: list[dict], info: dict, copy_gbs: float) -> None:
    print(f"\n{info['gpu']} (torch {info['torch']}): copy {copy_gbs:.0f} GB/s; times are CUDA-graph replays of one call")
    print(f"{'case':26s} {'subject':12s} {'us':>8s} {'x launch':>9s} {'x copy':>7s} {'x read':>7s}")
    for r in rows:
        if r["subject"] == "floors":
            print(f"{r['case']:26s} {'floors':12s} launch {r['launch']:.1f} us, copy {r['copy']:.1f} us, "
                  f"read {r['read']:.2f} us ({r['bytes'] / 1e6:.2f} MB)")
        elif "us" in r:
            print(f"{r['case']:26s} {r['subject']:12s} {r['us']:8.1f} {r['x_launch']:9.2f} {r['x_copy']:7.2f} "
                  f"{r['x_read']:7.1f}")
        else:
            print(f"{r['case']:26s} {r['subject']:12s} {'-':>8s}  {r.get('error', r['how'])[:90]}")


if __name__ == "__main__":
    sys.exit(main())
