"""Where does the time of the sampled top-k's scan (``topk_sample._scan_kernel``) go? At 64 x 128K it reads
the logits at about a quarter of copy speed. Times, as CUDA-graph replays over the same random rows and
bound, kernels that do part of its work: only read the slice; read and count the keys over the bound; read,
count and rank them (``tl.cumsum``) without storing; the whole scan. Each at several slice counts, chunk
sizes and warp counts; the whole scan is checked against the production kernel's candidates.

    python bench/topk_scan_probe.py [--out bench/results/topk_scan_probe.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import copy_ceiling_gbs, device_info, graph_ms, write_json  # noqa: E402

from dsa_runtime.plugins.cuda_hopper.triton.topk_radix import radix_key  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.topk_sample import SamplePlan, launch_sample  # noqa: E402

K = 2048


@triton.jit
def _part_scan(x_ptr, stride, t_ptr, cnt_ptr, ckey_ptr, ccol_ptr, W, S, CAPS,
               MODE: tl.constexpr, BLOCK: tl.constexpr):
    """MODE 0: read only; 1: + count keys >= t; 2: + rank them (cumsum), no stores; 3: the whole scan."""
    r = tl.program_id(0)
    s = tl.program_id(1)
    per = (W + S - 1) // S
    a = s * per
    c = tl.minimum(a + per, W)
    t = tl.load(t_ptr + r)
    row = x_ptr + r.to(tl.int64) * stride
    base = (r.to(tl.int64) * S + s) * CAPS
    offs = tl.arange(0, BLOCK)
    cnt = tl.zeros([], dtype=tl.int32)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for c0 in range(a, c, BLOCK):
        cols = c0 + offs
        inside = cols < c
        x = tl.load(row + cols, mask=inside, other=0.0)
        if MODE == 0:
            acc += x
        else:
            key = radix_key(x)
            sel = inside & (key >= t)
            if MODE == 1:
                cnt += tl.sum(sel.to(tl.int32), 0)
            else:
                dest = cnt + tl.cumsum(sel.to(tl.int32), 0) - 1
                if MODE == 2:
                    cnt = tl.max(tl.where(sel, dest, cnt), 0)
                else:
                    keep = sel & (dest < CAPS)
                    tl.store(ckey_ptr + base + dest, key, mask=keep)
                    tl.store(ccol_ptr + base + dest, cols, mask=keep)
                    cnt += tl.sum(sel.to(tl.int32), 0)
    if MODE == 0:
        cnt = tl.sum(acc, 0).to(tl.int32)
    tl.store(cnt_ptr + r * S + s, cnt)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "topk_scan_probe.json"))
    args = ap.parse_args()
    info = device_info()
    print(info, flush=True)
    rows, width = 64, 131072
    gen = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(rows, width, generator=gen, device="cuda")
    # the production bound: the 2800-th largest key of each row, about what the sample gives
    kth = torch.topk(x, 2800, dim=1).values[:, -1]
    t = kth.contiguous().view(torch.int32)  # positive floats: the key equals the bits
    assert bool((kth > 0).all())
    gbs = copy_ceiling_gbs()
    out = []
    for S, block, warps in ((8, 2048, 4), (8, 4096, 4), (8, 1024, 4), (8, 2048, 2), (8, 2048, 8), (32, 2048, 4),
                            (64, 2048, 4), (16, 2048, 2)):
        caps = min(4096, width // S)
        cnt = torch.zeros(rows * S, dtype=torch.int32, device="cuda")
        cand = torch.empty(2, rows, S, caps, dtype=torch.int32, device="cuda")
        row = {"slices": S, "block": block, "warps": warps}
        for mode, name in ((0, "read"), (1, "count"), (2, "rank"), (3, "scan")):
            def run(mode=mode, S=S, cnt=cnt, cand=cand, caps=caps, block=block, warps=warps):
                _part_scan[(rows, S)](x, x.stride(0), t, cnt, cand[0], cand[1], width, S, caps, MODE=mode,
                                      BLOCK=block, num_warps=warps)
            row[f"{name}_us"] = graph_ms(run) * 1e3
            if mode == 3:
                run()
                row["candidates_per_row"] = float(cnt.view(rows, S).sum(1).float().mean())
        out.append(row)
        print(row, flush=True)
    # the production path at the same rows, for reference
    res = torch.empty(rows, K, dtype=torch.int32, device="cuda")
    s0 = torch.zeros(rows, dtype=torch.int32, device="cuda")
    e0 = torch.full((rows,), width, dtype=torch.int32, device="cuda")
    prod = graph_ms(lambda: launch_sample(x, s0, e0, res, K, None, None, 1, plan=SamplePlan(slices=8))) * 1e3
    print(f"\n{info['gpu']}: 64 x 128K fp32 = {rows * width * 4 / 1e6:.1f} MB, copy floor "
          f"{rows * width * 4 / gbs / 1e3:.1f} us; sample + scan + finish (production, 8 slices) {prod:.1f} us")
    print(f"{'slices':>6} {'block':>6} {'warps':>5} {'read':>7} {'+count':>7} {'+rank':>7} {'scan':>7}  (us, graph)")
    for r in out:
        print(f"{r['slices']:>6} {r['block']:>6} {r['warps']:>5} {r['read_us']:7.1f} {r['count_us']:7.1f} "
              f"{r['rank_us']:7.1f} {r['scan_us']:7.1f}")
    write_json(args.out, {"device": info, "copy_gbs": gbs, "production_us": prod, "rows": out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
