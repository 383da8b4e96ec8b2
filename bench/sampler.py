"""Batched device sampling (``core/engine/sampler.py``) beside the former row-by-row sampler (the tests' oracle).

For ``B`` rows of a ``V``-token vocabulary (default 64 x 129280, DeepSeek V3's vocabulary) and each parameter
mix, times:

* ``sample``: the device pass alone (``SamplingTensors`` built beforehand);
* ``sample_rows``: the engine's call: tensors built from the parameters, the pass, one copy to the host;
* ``graph``: on CUDA, ``sample`` captured in a CUDA graph over static buffers (every filter on) and replayed;
* ``old``: the former per-row sampler (CPU generators; non-greedy rows copied to the CPU and filtered there).

Medians in milliseconds (CPU: wall clock with the machine's torch threads; CUDA: events around each call).

    python3 bench/sampler.py [--device cpu|cuda] [--batch 64] [--vocab 129280] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from common import time_ms  # noqa: E402

from dsa_runtime.engine.params import SamplingParams  # noqa: E402
from dsa_runtime.engine.sampler import SamplingTensors, sample, sample_rows  # noqa: E402
from tests.engine.sampling_oracle import sample_rows_generators  # noqa: E402


def mixes(batch: int) -> dict[str, list[SamplingParams]]:
    """Parameter mixes by name; ``mixed`` cycles greedy / top-p / top-k + min-p / top-k + top-p rows."""
    cycle = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.7, top_p=0.95),
        SamplingParams(temperature=1.0, top_k=50, min_p=0.05),
        SamplingParams(temperature=0.8, top_k=40, top_p=0.9),
    ]
    return {
        "mixed": [cycle[i % 4] for i in range(batch)],
        "top_p 0.95": [SamplingParams(temperature=0.7, top_p=0.95)] * batch,
        "top_k 50": [SamplingParams(top_k=50)] * batch,
        "temperature": [SamplingParams(temperature=0.9)] * batch,
        "greedy": [SamplingParams(temperature=0)] * batch,
    }


def median_ms(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Median milliseconds of ``fn`` over ``reps`` runs after one warm-up (CUDA: bench/common.py's event timing)."""
    if device.type == "cuda":
        return time_ms(fn, reps=reps, warmup=1)
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def graph_replay(logits: torch.Tensor, tensors: SamplingTensors) -> Callable[[], None]:
    """``sample`` captured over static copies of ``logits`` / ``tensors``; returns the replay."""
    static = SamplingTensors.empty(tensors.batch, logits.device)
    tensors.copy_into(static)
    static_logits = logits.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        sample(static_logits, static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sample(static_logits, static)
    return graph.replay


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=129280)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    logits = torch.randn(args.batch, args.vocab, generator=torch.Generator().manual_seed(0)).mul_(3).to(device)
    seeds, offsets = list(range(args.batch)), [0] * args.batch
    print(f"{args.batch} x {args.vocab} float32 on {device} ({torch.get_num_threads()} CPU threads); ms, median")
    print(f"{'mix':12s} {'sample':>9s} {'sample_rows':>12s} {'graph':>9s} {'old':>9s}")
    rows = []
    for name, params in mixes(args.batch).items():
        tensors = SamplingTensors.from_params(params, seeds, offsets, device)
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        row = {
            "mix": name,
            "sample": median_ms(lambda t=tensors: sample(logits, t), device, args.reps),
            "sample_rows": median_ms(lambda p=params: sample_rows(logits, p, seeds, offsets), device, args.reps),
            "graph": median_ms(graph_replay(logits, tensors), device, args.reps) if device.type == "cuda" else None,
            "old": median_ms(lambda p=params, g=gens: sample_rows_generators(logits, p, g), device, args.reps),
        }
        rows.append(row)
        graph = f"{row['graph']:9.2f}" if row["graph"] is not None else f"{'-':>9s}"
        print(f"{name:12s} {row['sample']:9.2f} {row['sample_rows']:12.2f} {graph} {row['old']:9.2f}")
    if args.out:
        args.out.write_text(json.dumps({"device": str(device), "batch": args.batch, "vocab": args.vocab,
                                        "threads": torch.get_num_threads(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
