"""The conformance kit's ``moe_comm`` cases on every rank of a ``torchrun`` group (NCCL on GPUs, gloo on CPU).

    torchrun --nproc-per-node 8 tools/gpu/ep_kit.py nccl reference        # 8 GPUs, one rank each
    torchrun --nproc-per-node 2 tools/gpu/ep_kit.py --device cpu torch     # the same on gloo, no GPU

Every rank runs the same cases in the same order (the collectives pair up); each prints its summary, and the
exit code is non-zero when any rank saw a case that did not pass. ``--full`` adds V3.2's shapes (D = 7168).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("backends", nargs="+", help="moe_comm backends to certify (reference, torch, nccl, deepep)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--full", action="store_true")
    args = p.parse_args()
    from dsa_runtime.testing import run_conformance
    from dsa_runtime.testing.runner import summary_line

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank = dist.get_rank()
    bad = 0
    for backend in args.backends:
        report = run_conformance(backend, device=args.device, families=["moe_comm"], full=args.full,
                                 progress=False, isolate=False)
        failed = [c for c in report.cases if c.status != "passed"]
        bad += len(failed)
        print(f"rank {rank}/{dist.get_world_size()} {backend}: {summary_line(report)}", flush=True)
        for c in failed[:5]:
            print(f"  {c.id}: {c.status}: {c.message[:300]}", flush=True)
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
