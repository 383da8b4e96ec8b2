"""Shared helpers of the benchmark scripts: timing, ceilings measured in the same run, atomic JSON."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import torch


def time_ms(fn: Callable[[], object], *, reps: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of ``fn`` over ``reps`` runs, each bracketed by CUDA events (after ``warmup``)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def bench_ms(fn: Callable[[], object], *, slow: bool = False) -> float:
    """``triton.testing.do_bench`` median for fast calls; a few event-timed runs for slow baselines."""
    if slow:
        return time_ms(fn, reps=3, warmup=1)
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))


def copy_ceiling_gbs(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy of ``nbytes``: GB/s counting bytes read plus bytes written."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    return 2 * nbytes / ms / 1e6


def bf16_matmul_ceiling_tflops(n: int = 8192) -> float:
    """bf16 ``torch.matmul`` at ``n^3``, TFLOP/s (the sparse-attention benches' compute ceiling)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    return 2 * n**3 / bench_ms(lambda: a @ b) / 1e9


def fp8_matmul_ceiling_tflops(n: int = 8192) -> float:
    """``torch._scaled_mm`` e4m3 x e4m3 -> bf16 at ``n^3`` (per-tensor scales), TFLOP/s."""
    a = (torch.randn(n, n, device="cuda") * 8).to(torch.float8_e4m3fn)
    b = (torch.randn(n, n, device="cuda") * 8).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
    one = torch.ones((), device="cuda")
    ms = bench_ms(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    return 2 * n**3 / ms / 1e9


def device_info() -> dict[str, str]:
    import triton

    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name, "sms": str(props.multi_processor_count), "torch": torch.__version__,
        "triton": triton.__version__, "cuda": str(torch.version.cuda),
    }


def write_json(path: str | os.PathLike, data: dict) -> None:
    """Write ``data`` atomically (temp file in the same folder, then ``os.replace``)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1)
        os.replace(tmp, target)
    except BaseException:  # a value json cannot write, or an interrupt: no partial file left behind
        Path(tmp).unlink(missing_ok=True)
        raise


def kernel_times_us(fn: Callable[[], object], *, iters: int = 5) -> dict[str, float]:
    """Mean device time per call of each kernel ``fn`` launches (torch profiler), microseconds by kernel name."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for evt in prof.key_averages():
        total = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0.0)
        if total:
            out[evt.key[:40]] = out.get(evt.key[:40], 0.0) + total / iters
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def graph_ms(fn: Callable[[], object]) -> float:
    """Median replay time of ``fn`` captured in a CUDA graph (launch overhead removed, as an engine runs decode).

    The replay still carries the graph's own launch, about 4.5 us on an H200 against 1.4 us for a kernel launched
    inside a graph; :func:`graph_layers_ms` pays it once over several calls, as a decode step's layers do."""
    return graph_layers_ms([fn])


def graph_layers_ms(fns: Sequence[Callable[[], object]]) -> float:
    """Milliseconds per call of ``fns`` captured back to back in one CUDA graph: the median replay over
    ``len(fns)``. Each call is one layer of a decode step (give each its own inputs, so no call finds the
    previous one's rows in the L2); the graph's launch is paid once per step, not per layer. NaN (reported) when
    the capture fails."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # compile and warm up outside the capture
                for fn in fns:
                    fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for fn in fns:
                fn()
    except RuntimeError as exc:  # reported, not fatal: the eager timings still stand
        print(f"  graph capture failed: {str(exc).splitlines()[0][:200]}", flush=True)
        return float("nan")
    ms = bench_ms(graph.replay) / len(fns)
    del graph
    return ms


def step_profile(prof, steps: int, wall_ms: float, *, top: int = 0) -> dict:
    """Per step of a torch.profiler run over ``steps`` steps on this process's GPU: wall time beside the GPU's
    busy time (kernels of one stream do not overlap, so their sum is the busy time), NCCL's share of it, kernel
    launches and the rest (host: Python, launches, dispatch to other ranks, waiting); with ``top``, the
    ``top`` kernels by time (ms per step, by name)."""
    from torch.autograd import DeviceType

    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    by_name: dict[str, float] = {}
    for e in kernels:
        by_name[e.name] = by_name.get(e.name, 0.0) + e.time_range.elapsed_us() / 1e3 / steps
    busy = sum(by_name.values())
    nccl = sum(ms for name, ms in by_name.items() if "nccl" in name.lower())
    out = {"wall_ms": wall_ms, "gpu_busy_ms": busy, "nccl_ms": nccl, "compute_ms": busy - nccl,
           "kernels_per_step": len(kernels) / steps, "not_gpu_ms": wall_ms - busy}
    if top:
        out["top_kernels_ms"] = dict(sorted(by_name.items(), key=lambda kv: -kv[1])[:top])
    return out
