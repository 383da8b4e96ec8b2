"""Run the quick indexer conformance cases (and direct checks) against TritonIndexer on CPU under
``TRITON_INTERPRET=1`` (a subprocess: the interpreter must be chosen before triton compiles anything).
Prints one line per case / check; exit 1 on a miss."""

from __future__ import annotations

import os
import sys

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

from dsa_runtime.backend import Backend  # noqa: E402
from dsa_runtime.capabilities import Capabilities  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.indexer import INDEXER_CLAIMS, TritonIndexer  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.indexer_logits import RaggedConfig  # noqa: E402
from dsa_runtime.reference.indexer import ReferenceIndexer  # noqa: E402
from dsa_runtime.reference.plugin import reference_backend  # noqa: E402
from dsa_runtime.testing.registry import family_cases  # noqa: E402
from dsa_runtime.testing.runner import RunContext, run_case  # noqa: E402

CPU = torch.device("cpu")


def kit_cases() -> int:
    backend = Backend(
        "triton_interp", Capabilities(methods=INDEXER_CLAIMS, devices=frozenset({"cpu"})), {"indexer": TritonIndexer},
    )
    ctx = RunContext(backend, reference_backend(), CPU, CPU)
    bad = 0
    for case in family_cases("indexer"):
        if case.tier != "quick":
            continue
        res = run_case(case, ctx)
        print(f"kit {res.status} {case.id} {res.message[:300]}")
        bad += res.status != "passed"
    return bad


def _rand_fp8(gen, shape):
    return (torch.randn(shape, generator=gen) * 8).clamp(-448, 448).to(torch.float8_e4m3fn)


def _report(name: str, got: torch.Tensor, want: torch.Tensor) -> int:
    same_inf = torch.equal(torch.isinf(got), torch.isinf(want))
    fin = torch.isfinite(want)
    scale = want[fin].abs().max().item() if fin.any() else 1.0
    err = (got[fin] - want[fin]).abs().max().item() if fin.any() else 0.0
    ok = same_inf and err <= 1e-4 * scale + 1e-6 and not torch.isnan(got).any()
    print(f"direct {'passed' if ok else 'failed'} {name} err={err:.3g} scale={scale:.3g} inf_pattern={same_inf}")
    return 0 if ok else 1


def direct_checks() -> int:
    """Shapes the kit's quick tier does not reach: a wide-dot config, ragged windows crossing tiles."""
    gen = torch.Generator().manual_seed(7)
    ref, bad = ReferenceIndexer(), 0
    for heads, cfg in ((64, RaggedConfig(8, 32, 4)), (32, RaggedConfig(4, 16, 2)), (1, RaggedConfig(4, 32, 2))):
        t, s = 11, 70
        q8, k8 = _rand_fp8(gen, (t, heads, 128)), _rand_fp8(gen, (s, 128))
        w = torch.randn(t, heads, generator=gen) * 1e-3
        sc = torch.rand(s, generator=gen) + 0.5
        ks = torch.randint(0, 40, (t,), generator=gen, dtype=torch.int32)
        ke = (ks + torch.randint(0, 40, (t,), generator=gen, dtype=torch.int32)).clamp(max=s)
        ks[3], ke[3] = 5, 5  # empty window
        got = TritonIndexer(ragged_config=cfg).logits_ragged(q8, w, k8, sc, ks, ke)
        bad += _report(f"ragged h{heads} {cfg}", got, ref.logits_ragged(q8, w, k8, sc, ks, ke))
    return bad


def main() -> int:
    bad = kit_cases() + direct_checks()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
