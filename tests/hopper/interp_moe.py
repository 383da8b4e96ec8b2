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
    # The one-program alignment used at decode sizes equals the torch one (bad ids dropped like -1).
    from dsa_runtime.plugins.cuda_hopper.triton.moe_align import align_pairs
    from dsa_runtime.plugins.cuda_hopper.triton.moe_align_small import align_pairs_small

    gen = torch.Generator().manual_seed(5)
    for tokens, top_k, n_exp, block_m, shared in ((1, 8, 256, 16, True), (37, 3, 9, 4, False), (64, 8, 256, 16, True),
                                                   (5, 2, 3, 16, False)):
        ids = torch.randint(-1, n_exp + 2, (tokens, top_k), generator=gen, dtype=torch.int32)
        flat = torch.where(ids < n_exp, ids, -1).reshape(-1)
        if shared:
            flat = torch.cat([flat, torch.full((tokens,), n_exp, dtype=torch.int32)])
        want = align_pairs(flat, n_exp + shared, block_m)
        got = align_pairs_small(ids, n_exp, block_m, shared=shared)
        same = all(torch.equal(getattr(got, f), getattr(want, f)) for f in ("sorted_pairs", "block_expert", "num_padded"))
        print(f"align-small check {tokens}x{top_k} e{n_exp} bm{block_m} shared={shared}: {'passed' if same else 'FAILED'}")
        bad += not same
    from dsa_runtime.families import ExpertWeights

    # The prefill tile options (row-block groups, the two-pass w13 tile) change the schedule, not the sums.
    from dsa_runtime.plugins.cuda_hopper.triton.moe_experts import TileConfig
    from dsa_runtime.reference.fp8 import block_quant_weight

    def fp8_stack(w):
        pairs = [block_quant_weight(m) for m in w]
        return torch.stack([q for q, _ in pairs]), torch.stack([s for _, s in pairs])

    (w13, s13), (w2, s2) = fp8_stack(torch.randn(4, 512, 256) * 0.05), fp8_stack(torch.randn(4, 256, 256) * 0.05)
    ew8 = ExpertWeights(w13, w2, s13, s2)
    x8 = torch.randn(9, 256).bfloat16()
    ids8 = torch.randint(0, 4, (9, 2), dtype=torch.int32)
    w8 = torch.rand(9, 2)
    plain = TritonMoE(config=TileConfig(16)).experts(x8, w8, ids8, ew8)
    tiled = TritonMoE(config=TileConfig(16, group_m=4, split_n=True)).experts(x8, w8, ids8, ew8)
    same = torch.equal(plain, tiled)
    print(f"align-small check tile options equal: {'passed' if same else 'FAILED'}")
    bad += not same
    # An id outside [-1, E) is a clear error (as in the reference), raised after the launches.

    x = torch.randn(3, 128).bfloat16()
    ew = ExpertWeights(torch.randn(2, 64, 128).bfloat16(), torch.randn(2, 128, 32).bfloat16())
    try:
        TritonMoE(check_ids=True).experts(x, torch.ones(3, 1), torch.tensor([[0], [2], [-1]], dtype=torch.int32), ew)
        print("bad-id check: no error raised")
        bad += 1
    except ValueError as exc:
        print(f"bad-id check: passed ({exc})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
