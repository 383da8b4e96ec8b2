"""Where does the time of the register-resident top-k (``topk_bisect``) go? Times, per shape, a kernel that only
loads the rows, one that loads and finds the threshold, and the whole kernel with each final-pass variant
(chunked pass over memory with several chunk sizes, or one scan over the registers), at several warp counts.
Every whole-kernel variant is first checked to equal the default's output exactly (order included).

    python bench/topk_bisect_probe.py [--out bench/results/topk_bisect_probe.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import device_info, graph_ms, write_json  # noqa: E402

from dsa_runtime.plugins.cuda_hopper.triton.topk_bisect import bisect_width, kth_key, launch_bisect  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.topk_radix import radix_key  # noqa: E402

K = 2048


@triton.jit
def _load_only(x_ptr, stride, ends_ptr, out_ptr, WIDTH: tl.constexpr):
    r = tl.program_id(0)
    cols = tl.arange(0, WIDTH)
    hi = tl.load(ends_ptr + r)
    key = tl.where(cols < hi, radix_key(tl.load(x_ptr + r.to(tl.int64) * stride + cols, mask=cols < hi)), -2147483648)
    tl.store(out_ptr + r, tl.sum((key > 0).to(tl.int32), 0))


@triton.jit
def _load_kth(x_ptr, stride, ends_ptr, out_ptr, k, WIDTH: tl.constexpr):
    r = tl.program_id(0)
    cols = tl.arange(0, WIDTH)
    hi = tl.load(ends_ptr + r)
    key = tl.where(cols < hi, radix_key(tl.load(x_ptr + r.to(tl.int64) * stride + cols, mask=cols < hi)), -2147483648)
    tl.store(out_ptr + r, kth_key(key, k, hi > k))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "topk_bisect_probe.json"))
    args = ap.parse_args()
    info = device_info()
    print(info, flush=True)
    rows_out = []
    for rows, width, warp_list in ((64, 32768, (8, 16, 32)), (4096, 8192, (4, 8, 16))):
        gen = torch.Generator(device="cuda").manual_seed(3)
        x = torch.randn(rows, width, generator=gen, device="cuda")
        s = torch.zeros(rows, dtype=torch.int32, device="cuda")
        e = torch.full((rows,), width, dtype=torch.int32, device="cuda")
        scratch = torch.empty(rows, dtype=torch.int32, device="cuda")
        bw = bisect_width(width)
        want = torch.empty(rows, K, dtype=torch.int32, device="cuda")
        launch_bisect(x, s, e, want, K, None, None, 1)
        for warps in warp_list:
            row = {"shape": f"{rows}x{width}", "warps": warps}
            a = (x, x.stride(0), e, scratch)
            row["load_ms"] = graph_ms(lambda a=a, g=(rows,), w=warps, bw=bw: _load_only[g](*a, WIDTH=bw, num_warps=w))
            row["load_kth_ms"] = graph_ms(lambda a=a, g=(rows,), w=warps, bw=bw: _load_kth[g](*a, K, WIDTH=bw,
                                                                                              num_warps=w))
            for label, kw in (("mem1024", {"block": 1024}), ("mem4096", {"block": 4096}), ("mem8192", {"block": 8192}),
                              ("regs", {"reg_write": True})):
                out = torch.full((rows, K), -7, dtype=torch.int32, device="cuda")
                try:
                    launch_bisect(x, s, e, out, K, None, None, 1, warps=warps, **kw)
                    same = bool(torch.equal(out, want))
                    row[f"{label}_ms"] = graph_ms(lambda a=(x, s, e, out), w=warps, kw=kw: launch_bisect(
                        *a, K, None, None, 1, warps=w, **kw))
                    row[f"{label}_exact"] = same
                except Exception as exc:  # reported per variant
                    row[f"{label}_ms"] = float("nan")
                    row[f"{label}_error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            rows_out.append(row)
            print(row, flush=True)
    print("\nms (CUDA-graph replay); 'exact' = equal to the default's output, order included")
    print(f"{'shape':>10} {'warps':>5} {'load':>7} {'+kth':>7} {'mem1024':>8} {'mem4096':>8} {'mem8192':>8} {'regs':>8}")
    for r in rows_out:
        cells = " ".join(f"{r[f'{v}_ms']:8.4f}{'' if r.get(f'{v}_exact', False) else '!'}" for v in ("mem1024", "mem4096", "mem8192", "regs"))
        print(f"{r['shape']:>10} {r['warps']:>5} {r['load_ms']:7.4f} {r['load_kth_ms']:7.4f} {cells}")
    write_json(args.out, {"device": info, "k": K, "rows": rows_out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
