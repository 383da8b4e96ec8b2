"""The read ceiling of a sparse decode over ``fp8_656`` rows: pure gathers of the selected rows, no arithmetic.

    python bench/gather_ceiling.py [--json PATH]   (default bench/results/gather_ceiling.json)

A sparse decode step reads k = 2048 selected 656-byte rows per request; the few-head kernels are judged
by "% of copy", the selected rows' bytes per second against a streaming device copy. This bench asks how much of
that a gather of those rows can reach at all, whatever the arithmetic: three ways of reading them
(``bench/gather_ceiling.cu``: ``cp.async`` pieces into a shared ring, 16-byte loads into registers, one bulk / TMA
copy per row), each over the same slots as ``bench/fewhead_decode.py`` (batch 64, random slots of each request's own
32K context, ~1% ``-1``), the same slots sorted, and consecutive slots (a streaming read through the same code).
Each kernel's slices per request are planned from its residency like the decode kernels' (``x1``) and doubled
(``x2``). The few-head CUDA decode at 16 heads over the random slots runs in the same run for comparison (checked
against the reference backend first).
CUDA-graph replays; NVRTC compiles the kernels.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention_setup import D_QK, PAGE, SM_SCALE, bound, cache_pool  # noqa: E402
from common import copy_ceiling_gbs, device_info, graph_ms, write_json  # noqa: E402

from dsa_runtime.families import FP8_MLA_ROW_BYTES  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.cuda import fewhead_fp8, nvrtc  # noqa: E402
from dsa_runtime.testing.compare import out_and_lse  # noqa: E402
from dsa_runtime.testing.tolerances import tolerance  # noqa: E402

K, CONTEXT, BATCH = 2048, 32768, 64
SOURCE = Path(__file__).with_suffix(".cu")


@dataclass(frozen=True)
class Gather:
    """One way of reading: kernel name, threads per CTA and compile-time shape."""

    kernel: str
    threads: int
    chunk: int = 32
    stages: int = 2
    unroll: int = 8

    @property
    def label(self) -> str:
        if self.kernel == "gather_ldg":
            return f"ldg u{self.unroll}"
        rows = "" if self.kernel == "gather_bulk" else f"{self.chunk} rows x "
        return f"{self.kernel.removeprefix('gather_')} {rows}{self.stages} stages"

    @property
    def smem(self) -> int:
        slots = 4 * K
        if self.kernel == "gather_cp_async":
            return self.stages * self.chunk * FP8_MLA_ROW_BYTES + slots
        if self.kernel == "gather_bulk":
            return 128 + self.stages * 32 * FP8_MLA_ROW_BYTES + slots
        return 0  # static


GATHERS = (
    Gather("gather_cp_async", 128, 32, 2), Gather("gather_cp_async", 128, 32, 4), Gather("gather_cp_async", 128, 64, 3),
    Gather("gather_ldg", 128, unroll=4), Gather("gather_ldg", 128, unroll=8), Gather("gather_ldg", 128, unroll=16),
    Gather("gather_bulk", 32, stages=2), Gather("gather_bulk", 32, stages=4), Gather("gather_bulk", 32, stages=6),
)


def slots(pattern: str, gen: torch.Generator, pool_rows: int) -> torch.Tensor:
    """``[BATCH, K]`` int32 slots of each request's own context: ``random`` (the decode benches'), ``sorted``
    (the same, ascending) or ``consecutive``."""
    base = (torch.arange(BATCH, device="cuda") * CONTEXT) % pool_rows
    if pattern == "consecutive":
        return (base[:, None] + torch.arange(K, device="cuda")).to(torch.int32)
    idx = base[:, None] + torch.randint(0, CONTEXT, (BATCH, K), device="cuda", generator=gen)
    idx = torch.where(torch.rand(BATCH, K, device="cuda", generator=gen) < 0.01, -1, idx)
    return (idx.sort(dim=1).values if pattern == "sorted" else idx).to(torch.int32)


def check_decode(q: torch.Tensor, cache: torch.Tensor, sel: torch.Tensor) -> None:
    """The few-head decode against the reference backend on these inputs (raises on a mismatch)."""
    ref = bound("reference", "sparse_attn.decode", "fp8_656", {"heads": q.shape[2], "k": K, "page_size": PAGE})[0]
    want = ref(q, cache, sel, SM_SCALE, layout="fp8_656")
    got = fewhead_fp8.decode_fewhead_fp8_cuda(q, cache, sel, SM_SCALE)
    bad = out_and_lse(got[0], got[1], want[0], want[1], tolerance("sparse_attn.out"), tolerance("sparse_attn.lse"))
    if bad:
        raise SystemExit(f"few-head decode differs from the reference: {bad}")


def run_gather(g: Gather, kern: nvrtc.CudaKernel, cache: torch.Tensor, idx: torch.Tensor, splits: int,
               sink: torch.Tensor):
    per = -(-K // splits)
    per = -(-per // 32) * 32
    grid = (-(-K // per), BATCH, 1)
    args = [ctypes.c_void_p(cache.data_ptr()), ctypes.c_void_p(idx.data_ptr()), ctypes.c_int(K), ctypes.c_int(per),
            ctypes.c_void_p(sink.data_ptr())]
    return lambda: kern.launch(grid, (g.threads, 1, 1), args)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default="bench/results/gather_ceiling.json", help="write the results here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gather_ceiling: needs a CUDA device", file=sys.stderr)
        return 2
    info = device_info()
    copy = copy_ceiling_gbs()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{info['gpu']}: copy {copy:.0f} GB/s", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    cache = cache_pool(CONTEXT, "fp8_656", gen)
    pool_rows = cache.shape[0] * PAGE
    sink = torch.zeros(BATCH * K, dtype=torch.int32, device="cuda")
    source = SOURCE.read_text()
    rows: list[dict] = []
    for pattern in ("random", "sorted", "consecutive"):
        idx = slots(pattern, gen, pool_rows)
        nbytes = int((idx >= 0).sum()) * FP8_MLA_ROW_BYTES
        for g in GATHERS:
            opts = (f"-DCHUNK={g.chunk}", f"-DSTAGES={g.stages}", f"-DUNROLL={g.unroll}")
            kern = nvrtc.load_kernel(source, g.kernel, opts, g.smem, torch.device("cuda"))
            resident = kern.resident_blocks(g.threads)
            base_splits = max(1, min(K // 32, -(-resident * sms // BATCH)))
            for mult in (1, 2):
                ms = graph_ms(run_gather(g, kern, cache, idx, base_splits * mult, sink))
                row = {"pattern": pattern, "gather": g.label, "resident": resident, "splits": base_splits * mult,
                       "ms": ms, "pct_copy": 100 * nbytes / (ms * 1e-3) / (copy * 1e9)}
                rows.append(row)
                print(f"  {pattern:11s} {g.label:28s} x{mult} ({row['splits']} slices, {resident}/SM): "
                      f"{ms:.4f} ms  {row['pct_copy']:.0f}%", flush=True)
        if pattern == "random":
            q = torch.randn(BATCH, 1, 16, D_QK, device="cuda", generator=gen, dtype=torch.bfloat16)
            sel = idx[:, None]
            check_decode(q, cache, sel)
            ms = graph_ms(lambda q=q, sel=sel: fewhead_fp8.decode_fewhead_fp8_cuda(q, cache, sel, SM_SCALE))
            decode = {"pattern": pattern, "gather": "few-head decode, 16 heads", "ms": ms,
                      "pct_copy": 100 * nbytes / (ms * 1e-3) / (copy * 1e9)}
            rows.append(decode)
            print(f"  {pattern:11s} {decode['gather']:28s}: {ms:.4f} ms  {decode['pct_copy']:.0f}%", flush=True)

    print(f"\n{info['gpu']}, {datetime.date.today()}, batch {BATCH} x k {K} rows of 656 B, copy {copy:.0f} GB/s "
          "(best of x1 / x2 slices)\n")
    print("| gather | random ms | % copy | sorted ms | % copy | consecutive ms | % copy |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label in dict.fromkeys(r["gather"] for r in rows):
        cells = []
        for pattern in ("random", "sorted", "consecutive"):
            got = [r for r in rows if r["gather"] == label and r["pattern"] == pattern and r["ms"]]
            best = min(got, key=lambda r: r["ms"]) if got else None
            cells += [f"{best['ms']:.4f}", f"{best['pct_copy']:.0f}%"] if best else ["", ""]
        print(f"| {label} | " + " | ".join(cells) + " |")
    write_json(args.json, {"device": info, "copy_gbs": copy, "batch": BATCH, "k": K, "context": CONTEXT, "rows": rows})
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
