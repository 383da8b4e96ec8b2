"""Engine decode speed on one GPU: the embedded tiny-chat model through ``Engine.step`` at several batch sizes,
CUDA graphs on and off: wall ms per decode step, GPU kernel ms per step (torch.profiler), their ratio and
tokens/s; plus the cold start (engine build with graph capture, to the first token).

    python bench/engine_gpu.py [--batches 1,16,64,128] [--steps 64] [--prompt-len 64] [--json PATH]

Method: B random prompts of ``--prompt-len`` tokens arrive together (greedy, EOS ignored); once every request
has its first token, ``--steps`` decode steps are timed wall-clock (the engine's own Python included:
scheduling, sampling, detokenising, stop checks), then ``--profile-steps`` more under torch.profiler, whose
CUDA kernel time per step is the step's GPU time (ratio = wall / kernel; 1.0 would mean the GPU never waits
for the host). Results print as a table and go to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from pathlib import Path
from typing import Any


def kernel_ms(prof: Any) -> float:
    """Total CUDA kernel time of a profile, ms (memcpy/memset included: they occupy the GPU too)."""
    total_us = 0.0
    for evt in prof.events():
        if getattr(evt, "device_type", None) is not None and str(evt.device_type).endswith("CUDA"):
            total_us += evt.device_time
    return total_us / 1e3


def run_case(engine: Any, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from dsa_runtime.engine import SamplingParams

    rng = random.Random(batch)
    vocab = engine.parts.vocab_size
    total = args.steps + args.profile_steps + 4
    params = SamplingParams(temperature=0, max_tokens=total, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"r{batch}-{i}", [rng.randrange(3, vocab) for _ in range(args.prompt_len)], params)
    while any(r.num_output_tokens == 0 for r in engine._requests.values()):
        engine.step()
    for _ in range(2):  # settle: every request decoding, first decode shapes compiled
        engine.step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3 / args.steps
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.profile_steps):
            engine.step()
        torch.cuda.synchronize()
    gpu = kernel_ms(prof) / args.profile_steps
    while engine.has_unfinished():
        engine.step()
    assert engine.stats().pages_used == 0
    return {"batch": batch, "wall_ms": wall, "kernel_ms": gpu, "ratio": wall / gpu if gpu else None,
            "tokens_per_s": batch * 1e3 / wall}


COLD = """
import time, sys
t0 = float(sys.argv[1])
from dsa_runtime.engine import Engine, EngineConfig, SamplingParams
engine = Engine(EngineConfig(max_running_requests=int(sys.argv[2])))
engine.add_request("cold", [5, 6, 7], SamplingParams(temperature=0, max_tokens=2))
while engine.has_unfinished():
    engine.step()
print("FIRST_TOKEN_S", time.time() - t0)
"""


def make_engine(mode: str, max_bs: int) -> Any:
    from dsa_runtime.engine import Engine, EngineConfig

    return Engine(EngineConfig(max_running_requests=max_bs, disable_cuda_graph=(mode == "eager"),
                               disable_overlap_schedule=mode not in ("overlap", "mp"),
                               distributed_executor_backend="mp" if mode == "mp" else "uni"))


def triton_launches(step, steps: int = 8) -> None:
    """Triton launches per step by kernel, with the host time each launch call takes (``JITFunction.run``:
    argument binding, cache lookup, the launch itself)."""
    import collections

    import triton.runtime.jit as jit

    count: collections.Counter = collections.Counter()
    host: collections.Counter = collections.Counter()
    real = jit.JITFunction.run

    def timed(self, *args, **kwargs):
        t = time.perf_counter()
        out = real(self, *args, **kwargs)
        host[self.fn.__name__] += time.perf_counter() - t
        count[self.fn.__name__] += 1
        return out

    jit.JITFunction.run = timed
    try:
        for _ in range(steps):
            step()
    finally:
        jit.JITFunction.run = real
    print(f"Triton: {sum(count.values()) / steps:.1f} launches a step, {sum(host.values()) / steps * 1e3:.3f} ms "
          "of host time in them")
    for name, n in count.most_common(30):
        print(f"  {n / steps:6.1f} a step  {host[name] / n * 1e6:7.1f} us each  {name}")


def torch_calls(step, steps: int = 4) -> None:
    """torch functions called per step, by the repository line that called them (properties and metadata
    reads left out)."""
    import collections
    import sys

    from torch.overrides import TorchFunctionMode

    skip = {"__get__", "shape", "dtype", "device", "size", "dim", "is_cuda", "__len__", "numel", "stride",
            "data_ptr", "is_contiguous", "element_size", "storage_offset", "__hash__", "__eq__"}
    by_line: collections.Counter = collections.Counter()
    root = str(Path(__file__).resolve().parents[1]) + "/"

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", str(func))
            if name not in skip:
                frame = sys._getframe(1)
                while frame is not None and (not frame.f_code.co_filename.startswith(root)
                                             or "site-packages" in frame.f_code.co_filename):
                    frame = frame.f_back
                where = f"{frame.f_code.co_filename[len(root):]}:{frame.f_lineno}" if frame else "?"
                by_line[(where, name)] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        for _ in range(steps):
            step()
    print(f"torch: {sum(by_line.values()) / steps:.0f} calls a step")
    for (where, name), n in by_line.most_common(40):
        print(f"  {n / steps:6.1f}  {where} {name}")


def profile_host(mode: str) -> None:
    """Where a decode step's host time goes, one request in ``mode``: Triton launches by kernel, torch calls by
    line, then cProfile of 16 steps."""
    import cProfile
    import pstats

    from dsa_runtime.engine import SamplingParams

    engine = make_engine(mode, 1)
    engine.add_request("p", list(range(3, 67)), SamplingParams(temperature=0, max_tokens=400, ignore_eos=True))
    for _ in range(8):
        engine.step()
    triton_launches(engine.step)
    torch_calls(engine.step)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(16):
        engine.step()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def cold_starts(max_bs: int) -> dict[str, float]:
    """Process start to first token, twice: the first compiles kernels into Triton's on-disk cache (empty on
    a fresh machine), the second finds them there (graphs are captured again: they do not outlive a process)."""
    import subprocess
    import sys

    out = {}
    for name in ("first", "second"):
        t0 = time.time()
        got = subprocess.run([sys.executable, "-c", COLD, str(t0), str(max_bs)], capture_output=True, text=True,
                             check=True).stdout
        out[name] = float(next(line.split()[1] for line in got.splitlines() if line.startswith("FIRST_TOKEN_S")))
        print(f"cold start ({name} process): {out[name]:.1f} s to the first token", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,16,64,128")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--profile-steps", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--modes", default="overlap,graphs,eager",
                    help="overlap (graphs + overlap scheduling, the default engine), graphs (--disable-overlap-schedule), "
                         "eager (--disable-cuda-graph --disable-overlap-schedule), mp (overlap through the distributed "
                         "runner at --tp 1: --distributed-executor-backend mp)")
    ap.add_argument("--cold-start", action="store_true",
                    help="also time two fresh processes from start to first token (the second finds the kernel caches)")
    ap.add_argument("--cprofile", metavar="MODE",
                    help="instead of the table: where a decode step's host time goes at batch 1 in MODE (Triton "
                         "launches by kernel with their host time, torch calls by line, cProfile top 25)")
    ap.add_argument("--speculative", action="store_true",
                    help="also tokens/s with and without MTP speculation at --spec-batches (bench/spec_decode.py: "
                         "held-out chat prompts to completion, 3 draft steps)")
    ap.add_argument("--spec-batches", default="1,8,32")
    ap.add_argument("--json", default="bench/results/engine_gpu.json")
    args = ap.parse_args()
    import torch

    from dsa_runtime.engine import SamplingParams

    if not torch.cuda.is_available():
        raise SystemExit("engine_gpu.py needs a CUDA device")
    batches = [int(b) for b in args.batches.split(",")]
    if args.cprofile:
        return profile_host(args.cprofile)
    cold = cold_starts(max(batches)) if args.cold_start else {}  # first, before this process compiles anything
    rows: list[dict[str, Any]] = []
    starts: dict[str, float] = {}
    for mode in args.modes.split(","):
        t0 = time.perf_counter()
        engine = make_engine(mode, max(batches))
        engine.add_request("cold", [5, 6, 7], SamplingParams(temperature=0, max_tokens=1))
        while engine.has_unfinished():
            engine.step()
        starts[mode] = time.perf_counter() - t0
        print(f"{mode}: engine built and first token in {starts[mode]:.1f} s, graphs of up to "
              f"{engine.runner.graph_rows} rows")
        for batch in batches:
            row = {"mode": mode, **run_case(engine, batch, args)}
            rows.append(row)
            print(f"  batch {batch:4d}: {row['wall_ms']:.3f} ms/step wall, {row['kernel_ms']:.3f} ms kernels, "
                  f"ratio {row['ratio']:.2f}, {row['tokens_per_s']:.0f} tok/s", flush=True)
        engine.close()  # the mp mode's worker process and process group (nothing to stop otherwise)
        del engine
        import gc

        gc.collect()  # the engine's cache and graph pools must be gone before the next engine sizes its cache
        torch.cuda.empty_cache()
    print(f"\n| mode | batch | wall ms/step | GPU kernel ms/step | wall/kernel | tokens/s |  ({torch.cuda.get_device_name()})")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mode']} | {r['batch']} | {r['wall_ms']:.3f} | {r['kernel_ms']:.3f} | {r['ratio']:.2f} | "
              f"{r['tokens_per_s']:.0f} |")
    out = {"bench": "engine_gpu", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
           "settings": vars(args), "engine_start_s": starts, "process_start_to_first_token_s": cold,
           "rows": rows}
    if args.speculative:
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from spec_decode import measure, print_table

        spec_rows = measure([int(b) for b in args.spec_batches.split(",")], 200, 3, "cuda")
        print_table(spec_rows, torch.cuda.get_device_name())
        out["speculative"] = spec_rows
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
