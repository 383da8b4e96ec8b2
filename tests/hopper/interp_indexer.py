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
    for heads, cfg in ((64, RaggedConfig(8, 32, 4)), (32, RaggedConfig(4, 16, 2, imprecise_acc=32)), (1, RaggedConfig(4, 32, 2))):
        t, s = 11, 70
        q8, k8 = _rand_fp8(gen, (t, heads, 128)), _rand_fp8(gen, (s, 128))
        w = torch.randn(t, heads, generator=gen) * 1e-3
        sc = torch.rand(s, generator=gen) + 0.5
        ks = torch.randint(0, 40, (t,), generator=gen, dtype=torch.int32)
        ke = (ks + torch.randint(0, 40, (t,), generator=gen, dtype=torch.int32)).clamp(max=s)
        ks[3], ke[3] = 5, 5  # empty window
        got = TritonIndexer(ragged_config=cfg).logits_ragged(q8, w, k8, sc, ks, ke)
        bad += _report(f"ragged h{heads} {cfg}", got, ref.logits_ragged(q8, w, k8, sc, ks, ke))
    bad += paged_check(gen, ref, heads=64, n_q=3, page=64, lens=[1, 130, 3, 64])
    bad += paged_check(gen, ref, heads=20, n_q=1, page=4, lens=[9, 0, 17])
    return bad + chunked_topk_check(gen)


def paged_check(gen, ref, heads: int, n_q: int, page: int, lens: list[int]) -> int:
    """Paged logits against the reference; N=3 exercises the padded query dimension (NQP=4)."""
    batch, max_pages = len(lens), -(-max(lens) // page) + 1
    pages = batch * max_pages + 2
    k8 = _rand_fp8(gen, (pages, page, 128)).view(torch.uint8).reshape(pages, -1)
    scales = (torch.rand(pages, page, generator=gen) + 0.25).view(torch.uint8).reshape(pages, -1)
    cache = torch.cat([k8, scales], dim=1).contiguous()
    table = torch.randperm(pages, generator=gen)[: batch * max_pages].view(batch, max_pages).to(torch.int32)
    q8 = _rand_fp8(gen, (batch, n_q, heads, 128))
    w = torch.randn(batch * n_q, heads, generator=gen) * 1e-3
    ctx = torch.tensor(lens, dtype=torch.int32)
    args = (q8, w, cache, ctx, table, max(lens) + 5)
    return _report(f"paged h{heads} n{n_q} p{page}", TritonIndexer().logits_paged(*args), ref.logits_paged(*args))


def chunked_topk_check(gen) -> int:
    """ragged_topk_chunked under a budget of a few rows equals top-k of the unchunked logits."""
    from dsa_runtime.reference.topk import ReferenceTopK

    t, s, heads, k = 24, 40, 16, 8
    q8, k8 = _rand_fp8(gen, (t, heads, 128)), _rand_fp8(gen, (s, 128))
    w = torch.randn(t, heads, generator=gen) * 1e-3
    sc = torch.rand(s, generator=gen) + 0.5
    ke = torch.arange(s - t + 1, s + 1, dtype=torch.int32)
    ks = torch.zeros_like(ke)
    ks[5:9] = 20  # a second request's rows: a window not starting at 0
    topk = ReferenceTopK().topk
    ix = TritonIndexer()
    got = ix.ragged_topk_chunked(q8, w, k8, sc, ks, ke, k, budget_bytes=200 * 4 * s, topk_fn=topk)
    want = topk(ix.logits_ragged(q8, w, k8, sc, ks, ke), ks, ke, k)
    ok = got.shape == (t, k) and got.dtype == torch.int32 and torch.equal(got.sort(1).values, want.sort(1).values)
    print(f"direct {'passed' if ok else 'failed'} ragged_topk_chunked t{t} s{s} k{k}")
    return 0 if ok else 1


def main() -> int:
    bad = kit_cases() + direct_checks()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
