"""Launch one decode-path kernel a few times for Nsight Compute to profile (no timing, no output).

    ncu --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \\
        --section LaunchStats -k regex:_scan_kernel --launch-count 1 python3 bench/ncu_targets.py topk

Targets (random inputs, at the shapes their speed targets name: top-k within 0.05 ms, few-head decode at 50%
of copy and 2x padded FlashMLA):

* ``topk``: the Triton top-k of 64 x 128K fp32 logits, k 2048 (sample, scan, finish and the fallback's launches;
  filter with ``-k regex:_scan_kernel`` and the like);
* ``fewhead``: the Triton few-head sparse decode over an ``fp8_656`` cache, 16 heads, batch 64, 2048 of 32K rows
  (``-k regex:_fewhead_cols_kernel``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

TARGETS = ("topk", "fewhead")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", choices=TARGETS)
    ap.add_argument("--calls", type=int, default=3, help="calls of the target (the first compiles)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("ncu_targets.py needs a CUDA device")
    gen = torch.Generator(device="cuda").manual_seed(0)
    if args.target == "fewhead":
        import fewhead_decode as fd
        from attention_setup import SM_SCALE, cache_pool

        from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_decode_fewhead import decode_fewhead

        cache = cache_pool(fd.CONTEXT, "fp8_656", gen)
        a = fd.inputs(cache, 64, 1, 16, gen)
        for _ in range(args.calls):
            decode_fewhead(a["q"], a["cache"], a["indices"], SM_SCALE, layout="fp8_656")
    else:
        from dsa_runtime.plugins.cuda_hopper.triton.topk import TritonTopK

        x = torch.randn(64, 131072, device="cuda", generator=gen)
        starts = torch.zeros(64, dtype=torch.int32, device="cuda")
        ends = torch.full((64,), 131072, dtype=torch.int32, device="cuda")
        kern = TritonTopK()
        for _ in range(args.calls):
            kern.topk(x, starts, ends, 2048)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
