"""The CUDA C++ few-head ``fp8_656`` decode (NVRTC) against the reference backend on a Hopper GPU: ragged and
padded slots, empty queries, 1-16 heads and 32 (two head groups), MTP queries, huge and tiny q, non-power-of-two
scales, every slice plan, the merge launched as a programmatic dependent or plainly; the Triton backend routes to
it (and back with ``DSA_FEWHEAD_CUDA=0``); CUDA-graph replays match."""

from __future__ import annotations

import pytest
import torch

from dsa_runtime.plugins.cuda_hopper.cuda import fewhead_fp8
from dsa_runtime.plugins.cuda_hopper.cuda.fewhead_fp8 import CudaFewHeadConfig, decode_fewhead_fp8_cuda
from dsa_runtime.reference.sparse_attn import ReferenceSparseAttn
from dsa_runtime.testing.compare import out_and_lse
from dsa_runtime.testing.tolerances import tolerance
from tests.hopper.gpu_marks import HOPPER_GPU, cuda_graph_capture

pytestmark = [
    *HOPPER_GPU,
    pytest.mark.usefixtures("nvrtc_found"),
]
PAGE = 64
SCALE = 576**-0.5


def fp8_cache(rows: int, gen: torch.Generator, pow2: bool = True) -> torch.Tensor:
    """``[rows / 64, 64, 656]``: random e4m3 latent, four scales per row (powers of two or not), bf16 rope."""
    c8 = (torch.randn(rows, 512, device="cuda", generator=gen) * 64).to(torch.float8_e4m3fn)
    if pow2:
        scales = torch.exp2(torch.randint(-10, -4, (rows, 4), device="cuda", generator=gen).float())
    else:
        scales = torch.rand(rows, 4, device="cuda", generator=gen) * 0.01 + 1e-4
    pe = torch.randn(rows, 64, device="cuda", generator=gen).to(torch.bfloat16)
    row = torch.cat([c8.view(torch.uint8), scales.view(torch.uint8), pe.view(torch.uint8)], dim=1)
    return row.reshape(rows // PAGE, PAGE, 656)


def inputs(cache, batch, n_q, heads, k, gen, missing=0.01, empty=False, wild_q=False):
    rows = cache.shape[0] * PAGE
    idx = torch.randint(0, rows, (batch, n_q, k), device="cuda", generator=gen)
    idx = torch.where(torch.rand(batch, n_q, k, device="cuda", generator=gen) < missing, -1, idx).to(torch.int32)
    if empty:
        idx[0, 0] = -1
    q = torch.randn(batch, n_q, heads, 576, device="cuda", generator=gen).to(torch.bfloat16)
    if wild_q:  # a head past fp16's range (scaled down by a power of two in the kernel) and a tiny one
        # (x 2e4 takes the head's largest |q| past 16384; at x 3e5 the base-2 scores reach ~2e5, where fp32's own
        # rounding of a 576-term dot product moves a near-tie's weights by several percent in any implementation,
        # the reference's included: one draw at 32 heads missed by 0.34 on 5.66)
        q[:, :, 0] *= 2e4
        q[:, :, -1, :512] *= 1e-3
    return q, idx


def check(q, cache, idx, cfg=None):
    want_out, want_lse = ReferenceSparseAttn().decode(q, cache, idx, SCALE, layout="fp8_656")
    out, lse = decode_fewhead_fp8_cuda(q, cache, idx, SCALE, config=cfg)
    assert out.shape == want_out.shape and lse.shape == want_lse.shape
    bad = out_and_lse(out, lse, want_out, want_lse, tolerance("sparse_attn.out"), tolerance("sparse_attn.lse"))
    assert bad is None, bad
    return out, lse


@pytest.fixture(scope="module")
def cache() -> torch.Tensor:
    return fp8_cache(PAGE * 512, torch.Generator(device="cuda").manual_seed(0))


@pytest.mark.parametrize(
    ("batch", "n_q", "heads", "k", "missing", "empty", "wild_q"),
    [
        (64, 1, 16, 2048, 0.01, False, False),  # 4 slices merged by the second launch
        (64, 1, 8, 2048, 0.01, False, False),
        (5, 1, 5, 2048, 0.5, True, False),  # 16 slices; one query with no valid slot
        (3, 2, 16, 100, 0.3, True, False),  # one slice (direct bf16 output), a partial chunk
        (2, 4, 16, 777, 0.01, False, True),  # MTP queries, q beyond fp16 and tiny q
        (1, 1, 16, 2048, 0.0, False, False),
        (4, 1, 16, 4096, 0.9, False, False),  # mostly padding
        (7, 3, 1, 64, 0.0, False, False),
        (64, 1, 32, 2048, 0.01, False, False),  # two head groups of 16, 4 slices each
        (5, 1, 32, 2048, 0.5, True, False),
        (3, 2, 32, 100, 0.3, True, False),  # one slice: each group writes its half of the bf16 output
        (2, 4, 32, 777, 0.01, False, True),
    ],
)
def test_matches_reference(cache, batch, n_q, heads, k, missing, empty, wild_q):
    gen = torch.Generator(device="cuda").manual_seed(batch * 1000 + heads * 10 + k)
    q, idx = inputs(cache, batch, n_q, heads, k, gen, missing, empty, wild_q)
    out, lse = check(q, cache, idx)
    if empty:
        assert torch.isinf(lse[0, 0]).all() and (lse[0, 0] > 0).all()
        assert (out[0, 0] == 0).all()
    assert torch.isfinite(out).all()


@pytest.mark.parametrize(
    "cfg",
    [CudaFewHeadConfig(rescale_slack=0.0, ref_slack=1.0), CudaFewHeadConfig(stages=3), CudaFewHeadConfig(stages=4),
     CudaFewHeadConfig(partial_fp16=False), CudaFewHeadConfig(stages=3, partial_fp16=False, splits=3),
     CudaFewHeadConfig(splits=3),
     CudaFewHeadConfig(splits=1), CudaFewHeadConfig(min_blocks=3), CudaFewHeadConfig(pdl_merge=False),
     CudaFewHeadConfig(pdl_main=False), CudaFewHeadConfig(pdl_main=False, pdl_merge=False),
     CudaFewHeadConfig(l2_prefetch=0), CudaFewHeadConfig(l2_prefetch=256)],
    ids=lambda c: c.label,
)
def test_every_configuration_matches_reference(cache, cfg):
    gen = torch.Generator(device="cuda").manual_seed(7)
    q, idx = inputs(cache, 9, 1, 16, 2048, gen, missing=0.2)
    check(q, cache, idx, cfg)


def test_dependent_launch_merge_is_the_plain_merge(cache):
    """The merge launched as a programmatic dependent (waiting for the decode grid inside) reads the finished
    partials: bit for bit the plain launch's result, eager and replayed, with the slice plan changing between calls."""
    from dsa_runtime.plugins.cuda_hopper.triton.pdl import pdl_enabled

    assert pdl_enabled(True, torch.device("cuda"))  # SM90: the default config takes the dependent launch
    gen = torch.Generator(device="cuda").manual_seed(13)
    q, idx = inputs(cache, 6, 2, 16, 2048, gen, missing=0.3, empty=True)
    for splits in (3, 16, 0):
        plain = decode_fewhead_fp8_cuda(q, cache, idx, SCALE, config=CudaFewHeadConfig(splits=splits, pdl_merge=False))
        dependent = check(q, cache, idx, CudaFewHeadConfig(splits=splits))
        assert torch.equal(plain[0], dependent[0]) and torch.equal(plain[1], dependent[1])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = decode_fewhead_fp8_cuda(q, cache, idx, SCALE)
    for _ in range(3):
        q.copy_(torch.randn(q.shape, device="cuda", generator=gen).to(torch.bfloat16))
        graph.replay()
        plain = decode_fewhead_fp8_cuda(q, cache, idx, SCALE, config=CudaFewHeadConfig(pdl_merge=False))
        assert torch.equal(plain[0], captured[0]) and torch.equal(plain[1], captured[1])


def test_dependent_decode_launch_reads_what_the_kernel_before_it_wrote(cache):
    """Launched as a programmatic dependent (the default on SM90), the decode waits for the kernel just before
    it: q and the slots written by the preceding copies are the ones it reads, eager and in a replayed graph
    whose inputs change between replays; the plain launch gives the same bits."""
    gen = torch.Generator(device="cuda").manual_seed(17)
    q_src, idx_src = inputs(cache, 64, 1, 16, 2048, gen, missing=0.1)
    q, idx = torch.empty_like(q_src), torch.empty_like(idx_src)
    dependent = CudaFewHeadConfig()
    assert dependent.pdl_main
    plain_cfg = CudaFewHeadConfig(pdl_main=False, pdl_merge=False)

    def step():
        q.copy_(q_src)
        idx.copy_(idx_src)
        return decode_fewhead_fp8_cuda(q, cache, idx, SCALE, config=dependent)

    eager = step()
    plain = decode_fewhead_fp8_cuda(q_src, cache, idx_src, SCALE, config=plain_cfg)
    assert torch.equal(eager[0], plain[0]) and torch.equal(eager[1], plain[1])
    captured, replay = cuda_graph_capture(step)
    for _ in range(3):
        q_new, idx_new = inputs(cache, 64, 1, 16, 2048, gen, missing=0.1)
        q_src.copy_(q_new)
        idx_src.copy_(idx_new)
        replay()
        plain = decode_fewhead_fp8_cuda(q_new, cache, idx_new, SCALE, config=plain_cfg)
        assert torch.equal(captured[0], plain[0]) and torch.equal(captured[1], plain[1])


def test_scales_that_are_not_powers_of_two():
    gen = torch.Generator(device="cuda").manual_seed(3)
    cache = fp8_cache(PAGE * 64, gen, pow2=False)
    q, idx = inputs(cache, 7, 1, 16, 2048, gen)
    check(q, cache, idx)


def test_triton_backend_routes_here_unless_switched_off(cache, monkeypatch):
    from dsa_runtime.plugins.cuda_hopper.triton.sparse_attn import TritonSparseAttn

    gen = torch.Generator(device="cuda").manual_seed(11)
    q, idx = inputs(cache, 16, 1, 16, 2048, gen)
    direct = decode_fewhead_fp8_cuda(q, cache, idx, SCALE)
    routed = TritonSparseAttn().decode(q, cache, idx, SCALE, layout="fp8_656")
    assert torch.equal(routed[0], direct[0]) and torch.equal(routed[1], direct[1])
    assert fewhead_fp8.use_cuda_kernel(q[:, :, :1].expand(16, 1, 32, 576), 512)  # 32: two groups of 16
    assert not fewhead_fp8.use_cuda_kernel(q[:, :, :1].expand(16, 1, 48, 576), 512)
    monkeypatch.setenv(fewhead_fp8.ENV_SWITCH, "0")
    fewhead_fp8.enabled.cache_clear()
    try:
        assert not fewhead_fp8.use_cuda_kernel(q, 512)
        triton_out = TritonSparseAttn().decode(q, cache, idx, SCALE, layout="fp8_656")
    finally:
        fewhead_fp8.enabled.cache_clear()
    assert not torch.equal(triton_out[0], direct[0])  # the other kernel ran (different rounding)
    want = ReferenceSparseAttn().decode(q, cache, idx, SCALE, layout="fp8_656")
    assert out_and_lse(*triton_out, *want, tolerance("sparse_attn.out"), tolerance("sparse_attn.lse")) is None
    assert not fewhead_fp8.use_cuda_kernel(q[:, :, :1].expand(16, 1, 17, 576), 512)  # 17 heads: not here


@pytest.mark.parametrize("heads", [16, 32])
def test_cuda_graph_replay_matches_eager(cache, heads):
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, idx = inputs(cache, 32, 1, heads, 2048, gen)
    eager = decode_fewhead_fp8_cuda(q, cache, idx, SCALE)  # compiles and plans outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = decode_fewhead_fp8_cuda(q, cache, idx, SCALE)
    for _ in range(3):  # every replay must find the slice counters back at zero
        q2, idx2 = inputs(cache, 32, 1, heads, 2048, gen)
        q.copy_(q2)
        idx.copy_(idx2)
        graph.replay()
        torch.cuda.synchronize()
        again = decode_fewhead_fp8_cuda(q, cache, idx, SCALE)
        assert torch.equal(captured[0], again[0]) and torch.equal(captured[1], again[1])
        assert not torch.equal(eager[0], again[0])
        want = ReferenceSparseAttn().decode(q, cache, idx, SCALE, layout="fp8_656")
        assert out_and_lse(*captured, *want, tolerance("sparse_attn.out"), tolerance("sparse_attn.lse")) is None


def test_bad_inputs_are_refused(cache):
    q = torch.randn(1, 1, 48, 576, device="cuda").to(torch.bfloat16)
    idx = torch.zeros(1, 1, 8, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="1..16 or 32 heads"):
        decode_fewhead_fp8_cuda(q, cache, idx, SCALE)
    with pytest.raises(ValueError, match="fp8_656 cache"):
        decode_fewhead_fp8_cuda(q[:, :, :16], cache.view(torch.int8), idx, SCALE)
    with pytest.raises(ValueError, match="bf16"):
        decode_fewhead_fp8_cuda(q[:, :, :16].float(), cache, idx, SCALE)
