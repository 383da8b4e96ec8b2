"""Probe: the few-head ``fp8_656`` decode with the selected rows as ``wgmma``'s M side, against the production one.

    python bench/fewhead_wgmma.py [--phases] [--json PATH]   (default bench/results/fewhead_wgmma.json)

The target is 16 heads at batch 64 in half the time of FlashMLA padded to 64 heads. The production CUDA kernel
(``plugins/cuda_hopper/cuda/fewhead_fp8.cu``, ``mma.sync`` with the heads as M) converts every e4m3 byte twice
and is bound by latency at two 4-warp CTAs per SM. ``bench/fewhead_wgmma.cu`` is the other design: rows as M
(``wgmma m64n16k16``, no padding), each byte converted once into an fp16 tile by two producer warpgroups, one
consumer warpgroup running the products and the softmax (see the ``.cu`` file). Sm_90a only (Hopper).

Both kernels run on the inputs of ``bench/fewhead_decode.py`` (k 2048 random slots of each request's own 32K
context, ~1% ``-1``) as CUDA-graph replays in one run, after the probe passes the reference backend on ragged,
empty, wild-q and non-power-of-two-scale cases. Columns: the production kernel, the probe, the probe without its
merge launch (its output is then wrong: what the merge costs), and every slot ``-1`` (no row read: the arithmetic
and the loop alone). ``--phases`` adds each role's ``clock64()`` cycles per chunk (16 heads, batch 64).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import re
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention_setup import D_QK, PAGE, SM_SCALE, bound, cache_pool, fp8_cache  # noqa: E402
from common import device_info, graph_ms, write_json  # noqa: E402
from fewhead_decode import CONTEXT, inputs  # noqa: E402

from dsa_runtime.plugins.cuda_hopper.cuda import nvrtc  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.cuda.fewhead_fp8 import decode_fewhead_fp8_cuda  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.fewhead_plan import FewHeadConfig, plan_splits, slice_rows  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.mla_fp8_decode import (  # noqa: E402
    LOG2E,
    flatten_decode_inputs,
    merge_slices,
    sm_count,
)
from dsa_runtime.testing.compare import out_and_lse  # noqa: E402
from dsa_runtime.testing.tolerances import tolerance  # noqa: E402

SOURCE = Path(__file__).with_suffix(".cu")
THREADS, CHUNK = 384, 64
# heads, queries, batch, slots ("random": the decode bench's; "all -1": no row read)
SHAPES = ((16, 1, 64, "random"), (16, 1, 64, "all -1"), (8, 1, 64, "random"), (16, 4, 64, "random"),
          (16, 1, 1, "random"), (16, 1, 128, "random"))
CONSUMER_PHASES = ("wait for a tile", "-", "-", "-", "scores", "softmax + P'", "barrier", "values")
PRODUCER_PHASES = ("wait for a free tile", "convert + store", "fence + signal", "slots + loads")


class Probe:
    """The compiled probe kernel (optionally with ``-DPHASE_TIMES``) and its launch."""

    def __init__(self, phases: bool = False) -> None:
        source = SOURCE.read_text()
        self.smem = int(re.search(r"^#define SMEM_BYTES (\d+)", source, flags=re.M).group(1))
        options = ("-DPHASE_TIMES",) if phases else ()
        self.kernel = nvrtc.load_kernel(source, "fewhead_wgmma_decode", options, self.smem, torch.device("cuda"),
                                        arch_suffix="a")
        self.times = torch.zeros(12 * 8, dtype=torch.int64, device="cuda")
        self.ctas = 0  # of the last launch

    def __call__(self, q: torch.Tensor, cache: torch.Tensor, indices: torch.Tensor, merge: bool = True):
        """``q`` ``[B, Q, H <= 16, 576]`` bf16, ``cache`` ``[pages, 64, 656]`` uint8, ``indices`` ``[B, Q, K]``
        int32 -> ``out`` ``[B, Q, H, 512]`` bf16, ``lse`` ``[B, Q, H]`` (natural log, +inf with no valid slot)."""
        batch, n_q, heads, _ = q.shape
        qf, idx = flatten_decode_inputs(q, indices)
        qf = qf.contiguous()
        top_k, mq = idx.shape[1], batch * n_q
        out = torch.empty(mq, heads, 512, dtype=torch.bfloat16, device=q.device)
        lse = torch.empty(mq, heads, dtype=torch.float32, device=q.device)
        plan = FewHeadConfig(block_n=CHUNK, min_rows=128)
        splits = plan_splits(mq, top_k, sm_count(q.device), self.kernel.resident_blocks(THREADS), plan)
        splits, per = slice_rows(top_k, splits, CHUNK)
        if splits > 1:
            part = torch.empty(mq, splits, heads, 512, dtype=torch.float32, device=q.device)
            plse = torch.empty(mq, splits, heads, dtype=torch.float32, device=q.device)
        else:
            part = plse = lse
        ptr = ctypes.c_void_p
        self.ctas = splits * mq
        self.kernel.launch((splits, mq, 1), (THREADS, 1, 1), [
            ptr(qf.data_ptr()), ptr(cache.data_ptr()), ptr(idx.data_ptr()), ptr(part.data_ptr()),
            ptr(plse.data_ptr()), ptr(out.data_ptr()), ptr(lse.data_ptr()), ctypes.c_int(heads),
            ctypes.c_int(top_k), ctypes.c_int(per), ctypes.c_int(splits), ctypes.c_float(SM_SCALE * LOG2E),
            ctypes.c_longlong(qf.stride(0)), ctypes.c_longlong(qf.stride(1)), ctypes.c_longlong(idx.stride(0)),
            ptr(self.times.data_ptr())])
        if splits > 1 and merge:
            merge_slices(part, plse, out, lse, 512, min_programs=4 * sm_count(q.device), pdl=True)
        return out.reshape(batch, n_q, heads, 512), lse.reshape(batch, n_q, heads)


def check(probe: Probe, cache: torch.Tensor, gen: torch.Generator) -> list[str]:
    """The probe against the reference backend; the failures, one line each."""
    ref = bound("reference", "sparse_attn.decode", "fp8_656", {"heads": 16, "k": 2048, "page_size": PAGE})[0]
    small = fp8_cache(64 * 512, gen)  # small, non-power-of-two row scales
    scales = small.view(-1, 656)[:, 512:528].view(torch.float32)
    scales.copy_(torch.rand(scales.shape, device="cuda", generator=gen) * 0.01 + 1e-4)
    cases = [((64, 1, 16, 2048), {}), ((64, 1, 8, 2048), {}), ((3, 2, 16, 100), {"bad": 0.3, "empty": True}),
             ((5, 1, 5, 2048), {"bad": 0.5, "empty": True}), ((2, 4, 16, 777), {"wild_q": True}),
             ((1, 1, 16, 2048), {}), ((7, 1, 16, 2048), {"pool": small}), ((4, 1, 16, 4096), {"bad": 0.9}),
             ((128, 1, 16, 2048), {}), ((1, 1, 16, 300), {"bad": 0.0}), ((1, 1, 16, 40), {"bad": 0.0}),
             ((2, 1, 3, 33), {"bad": 0.1}), ((1, 1, 16, 65), {"bad": 0.0}), ((3, 1, 16, 96), {"bad": 0.2})]
    failures = []
    for (batch, n_q, heads, k), kw in cases:
        pool = kw.get("pool", cache)
        rows = pool.shape[0] * PAGE
        idx = torch.randint(0, rows, (batch, n_q, k), device="cuda", generator=gen)
        bad = torch.rand(batch, n_q, k, device="cuda", generator=gen) < kw.get("bad", 0.01)
        idx = torch.where(bad, -1, idx).to(torch.int32)
        if kw.get("empty"):
            idx[0, 0] = -1
        q = torch.randn(batch, n_q, heads, D_QK, device="cuda", generator=gen, dtype=torch.bfloat16)
        if kw.get("wild_q"):
            q[:, :, 0] *= 3e5
            q[:, :, 1, :512] *= 1e-3
        problem = against_reference(probe, ref, q, pool, idx)
        if problem:
            failures.append(f"batch {batch} x {n_q} queries, {heads} heads, k {k} {kw.keys() - {'pool'}}: {problem}")
    return failures


def against_reference(probe, ref, q: torch.Tensor, cache: torch.Tensor, idx: torch.Tensor) -> str:
    """What of ``probe(q, cache, idx)`` misses the reference ``ref`` by more than the kit's sparse-attention
    tolerances (out and lse), or ``""``."""
    want = ref(q, cache, idx, SM_SCALE, layout="fp8_656")
    got = probe(q, cache, idx)
    return out_and_lse(got[0], got[1], want[0], want[1], tolerance("sparse_attn.out"), tolerance("sparse_attn.lse"))


def shape_inputs(cache: torch.Tensor, heads: int, n_q: int, batch: int, slots: str, gen: torch.Generator):
    """``(q, cache, indices)`` of one :data:`SHAPES` row: the decode bench's inputs (``slots == "random"``), or
    with ``"all -1"`` every slot ``-1`` (no row read), ``"one slot"`` every slot of a query its first (rows from the
    L2, no DRAM), ``"consecutive"`` k consecutive slots of each request's context (DRAM-friendly)."""
    a = inputs(cache, batch, n_q, heads, gen)
    idx = a["indices"]
    if slots == "all -1":
        idx.fill_(-1)
    elif slots == "one slot":
        idx.copy_(idx.abs()[..., :1].expand_as(idx))
    elif slots == "consecutive":
        idx.copy_((idx.abs()[..., :1] // CONTEXT) * CONTEXT + torch.arange(idx.shape[-1], device=idx.device))
    elif slots != "random":
        raise ValueError(f"unknown slot pattern {slots!r}")
    return a["q"], a["cache"], idx


def phases(probe: Probe, a: dict) -> dict:
    """Cycles per chunk and warp of each phase (warps 0-3 consume, 4-11 produce), from one launch."""
    probe.times.zero_()
    probe(a["q"], a["cache"], a["indices"])
    torch.cuda.synchronize()
    chunks = probe.ctas * triton.cdiv(a["indices"].shape[-1] * a["q"].shape[0] * a["q"].shape[1] // probe.ctas, CHUNK)
    per = (probe.times.view(12, 8).double() / chunks).tolist()
    consumer = {name: round(sum(per[w][i] for w in range(4)) / 4) for i, name in enumerate(CONSUMER_PHASES) if name != "-"}
    producer = {name: round(sum(per[w][i] for w in range(4, 12)) / 8) for i, name in enumerate(PRODUCER_PHASES)}
    return {"consumer": consumer, "producer": producer}


def hopper_setup(bench: str) -> tuple[dict, torch.Generator, torch.Tensor] | None:
    """A Hopper probe bench's start: ``(device info, seeded generator, the decode bench's fp8_656 cache)``, or
    ``None`` after one line on stderr when there is no Hopper GPU or no NVRTC (the caller exits 2)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print(f"{bench}: needs a Hopper (sm_90) CUDA device", file=sys.stderr)
        return None
    if not nvrtc.available():
        print(f"{bench}: needs NVRTC (torch's CUDA wheels ship it)", file=sys.stderr)
        return None
    gen = torch.Generator(device="cuda").manual_seed(0)
    # the cache first: torch's CUDA context must exist before NVRTC loads
    return device_info(), gen, cache_pool(CONTEXT, "fp8_656", gen)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--phases", action="store_true", help="also time each role's phases (clock64, 16 heads, b64)")
    ap.add_argument("--json", default="bench/results/fewhead_wgmma.json", help="write the results here")
    args = ap.parse_args(argv)
    setup = hopper_setup("fewhead_wgmma")
    if setup is None:
        return 2
    info, gen, cache = setup
    probe = Probe()
    print(f"{info['gpu']}: probe {probe.kernel.registers} registers, {probe.kernel.local_bytes} B local, "
          f"{probe.smem} B shared", flush=True)
    failures = check(probe, cache, gen)
    for line in failures:
        print("check FAILED:", line, flush=True)
    if failures:
        return 1
    print("checks: all passed against the reference backend", flush=True)
    rows = []
    for heads, n_q, batch, slots in SHAPES:
        q, c, i = shape_inputs(cache, heads, n_q, batch, slots, gen)
        row = {"heads": heads, "queries": n_q, "batch": batch, "slots": slots,
               "cuda_ms": graph_ms(lambda q=q, c=c, i=i: decode_fewhead_fp8_cuda(q, c, i, SM_SCALE)),
               "probe_ms": graph_ms(lambda q=q, c=c, i=i: probe(q, c, i)),
               "probe_no_merge_ms": graph_ms(lambda q=q, c=c, i=i: probe(q, c, i, merge=False))}
        rows.append(row)
    result = {"device": info, "date": str(datetime.date.today()), "rows": rows}
    print(f"\n{info['gpu']}, {datetime.date.today()}, k 2048, CUDA-graph ms\n")
    print("| heads x queries, batch | slots | production (mma.sync) | probe (wgmma) | probe, no merge | probe / production |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['heads']} x {r['queries']}, {r['batch']} | {r['slots']} | {r['cuda_ms']:.4f} | "
              f"{r['probe_ms']:.4f} | {r['probe_no_merge_ms']:.4f} | {r['probe_ms'] / r['cuda_ms']:.2f} |")
    if args.phases:
        timed = Probe(phases=True)
        for slots in ("random", "all -1"):
            a = inputs(cache, 64, 1, 16, gen)
            if slots == "all -1":
                a["indices"].fill_(-1)
            split = phases(timed, a)
            result.setdefault("phases", {})[slots] = split
            print(f"\ncycles per 64-row chunk, {slots} slots (16 heads, batch 64; phases of one role add up to its "
                  "loop, the roles run side by side):")
            for role, cells in split.items():
                print(f"  {role}: " + ", ".join(f"{k} {v}" for k, v in cells.items()))
    write_json(args.json, result)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
