"""``dsa-runtime conformance triton --family indexer --full --device cuda`` on a Hopper GPU: every indexer
case passes (none is left unclaimed), and the paged decode logits replay inside a CUDA graph."""

from __future__ import annotations

import torch

from dsa_runtime.testing import run_conformance
from tests.hopper.gpu_marks import HOPPER_GPU

pytestmark = [
    *HOPPER_GPU,
]


def test_registered_backend_full_tier():
    report = run_conformance("triton", full=True, families=["indexer"], device="cuda", progress=False)
    bad = [f"{c.id}: {c.status}: {c.message[:300]}" for c in report.cases if c.status != "passed"]
    assert report.cases and not bad, "\n".join(bad)


def test_paged_logits_capture_in_a_cuda_graph():
    from dsa_runtime.plugins.cuda_hopper.triton.indexer import TritonIndexer
    from dsa_runtime.reference.indexer import ReferenceIndexer

    gen = torch.Generator(device="cuda").manual_seed(3)
    batch, n_q, heads, page, pages = 4, 2, 64, 64, 40
    cache = torch.empty(pages, page * 132, dtype=torch.uint8, device="cuda")
    cache[:, : page * 128] = (torch.randn(pages, page * 128, device="cuda", generator=gen) * 8).to(
        torch.float8_e4m3fn).view(torch.uint8)
    cache[:, page * 128:] = (torch.rand(pages, page, device="cuda", generator=gen) + 0.1).view(torch.uint8)
    table = torch.randperm(pages, device="cuda", generator=gen)[: batch * 10].view(batch, 10).to(torch.int32)
    lens = torch.tensor([640, 2, 333, 64], dtype=torch.int32, device="cuda")
    q8 = (torch.randn(batch, n_q, heads, 128, device="cuda", generator=gen) * 8).to(torch.float8_e4m3fn)
    w = torch.randn(batch * n_q, heads, device="cuda", generator=gen) * 1e-3
    ix = TritonIndexer()
    ix.logits_paged(q8, w, cache, lens, table, 650)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ix.logits_paged(q8, w, cache, lens, table, 650)
    lens.copy_(torch.tensor([100, 640, 5, 2], dtype=torch.int32))  # new lengths, same graph
    graph.replay()
    want = ReferenceIndexer().logits_paged(q8, w, cache, lens, table, 650)
    assert torch.equal(torch.isneginf(out), torch.isneginf(want))
    fin = torch.isfinite(want)
    torch.testing.assert_close(out[fin], want[fin], rtol=1e-3, atol=2e-3 * float(want[fin].abs().max()))
