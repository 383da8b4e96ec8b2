"""Run the quick MoE conformance cases against TritonMoE on CPU under ``TRITON_INTERPRET=1`` (a subprocess:
the interpreter must be chosen before triton compiles anything). Prints one line per case; exit 1 on a miss."""

from __future__ import annotations

import os
import sys

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

from dsa_runtime.backend import Backend  # noqa: E402
from dsa_runtime.capabilities import Capabilities  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.moe_experts import TritonMoE  # noqa: E402
from dsa_runtime.reference.plugin import reference_backend  # noqa: E402
from dsa_runtime.testing.registry import family_cases  # noqa: E402
from dsa_runtime.testing.runner import RunContext, run_case  # noqa: E402


def main() -> int:
    bad = 0
    cpu = torch.device("cpu")
    for fmt, fuse in (("ue8m0", True), ("float", False)):
        backend = Backend(
            f"triton_interp_{fmt}", Capabilities(families=frozenset({"moe"}), devices=frozenset({"cpu"})),
            {"moe": lambda fmt=fmt, fuse=fuse: TritonMoE(fmt, fuse_shared=fuse)},
        )
        ctx = RunContext(backend, reference_backend(), cpu, cpu)
        for case in family_cases("moe"):
            if case.tier != "quick" or (fmt == "float" and "/fp8/" not in case.id):
                continue  # the float pass re-runs only what the scale rule changes
            res = run_case(case, ctx)
            print(f"{fmt} fuse={fuse} {res.status} {case.id} {res.message[:300]}")
            bad += res.status != "passed"
    # An id outside [-1, E) is a clear error (as in the reference), raised after the launches.
    from dsa_runtime.families import ExpertWeights

    x = torch.randn(3, 128).bfloat16()
    ew = ExpertWeights(torch.randn(2, 64, 128).bfloat16(), torch.randn(2, 128, 32).bfloat16())
    try:
        TritonMoE().experts(x, torch.ones(3, 1), torch.tensor([[0], [2], [-1]], dtype=torch.int32), ew)
        print("bad-id check: no error raised")
        bad += 1
    except ValueError as exc:
        print(f"bad-id check: passed ({exc})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
