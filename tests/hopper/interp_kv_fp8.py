"""Run the quick kv_quant cases and the quick ``fp8_656`` decode cases against the Triton kernels on CPU under
``TRITON_INTERPRET=1`` (a subprocess: the interpreter must be chosen before triton compiles anything), then
direct checks of the decode (head counts, split = unsplit, all -1) and of the stores (poisoned cache).
Prints one line per check; exit 1 on a miss."""

from __future__ import annotations

import os
import sys
import time

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

from dsa_runtime.backend import Backend  # noqa: E402
from dsa_runtime.capabilities import Capabilities, MethodClaim  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.kv_quant import TritonKVQuant  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.mla_fp8_decode import decode_fp8_656  # noqa: E402
from dsa_runtime.reference.plugin import reference_backend  # noqa: E402
from dsa_runtime.testing.registry import family_cases  # noqa: E402
from dsa_runtime.testing.runner import RunContext, run_case  # noqa: E402


class FP8DecodeOnly:
    """A sparse_attn object whose decode sends ``fp8_656`` to :func:`decode_fp8_656` (the only claim)."""

    def decode(self, q, kv_cache, indices, sm_scale, *, layout, d_v=512):
        assert layout == "fp8_656", layout
        return decode_fp8_656(q, kv_cache, indices, sm_scale, d_v)


def kit_cases() -> int:
    cpu = torch.device("cpu")
    bad = 0
    backend = Backend(
        "triton_interp_kv", Capabilities(families=frozenset({"kv_quant"}), devices=frozenset({"cpu"})),
        {"kv_quant": TritonKVQuant},
    )
    ctx = RunContext(backend, reference_backend(), cpu, cpu)
    for case in family_cases("kv_quant"):
        if case.tier == "quick":
            t0 = time.perf_counter()
            res = run_case(case, ctx)
            print(f"{res.status} {case.id} {res.message[:300]}")
            print(f"{time.perf_counter() - t0:.2f}", file=sys.stderr)
            bad += res.status != "passed"
    attn = Backend(
        "triton_interp_fp8dec",
        Capabilities(devices=frozenset({"cpu"}),
                     methods={"sparse_attn.decode": MethodClaim(kv_layouts={"fp8_656"})}),
        {"sparse_attn": FP8DecodeOnly},
    )
    ctx = RunContext(attn, reference_backend(), cpu, cpu)
    for case in family_cases("sparse_attn"):
        if case.tier == "quick" and "/decode/fp8_656/" in case.id:
            t0 = time.perf_counter()
            res = run_case(case, ctx)
            print(f"{res.status} {case.id} {res.message[:300]}")
            print(f"{time.perf_counter() - t0:.2f}", file=sys.stderr)
            bad += res.status != "passed"
    return bad


def main() -> int:
    bad = kit_cases()
    from interp_kv_fp8_direct import direct_checks  # noqa: PLC0415 (beside this file)

    bad += direct_checks()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
