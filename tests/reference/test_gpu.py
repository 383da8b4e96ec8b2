"""Every family on CUDA agrees with the same call on CPU (device follows the inputs)."""

from __future__ import annotations

import pytest
import torch

from dsa_runtime.families import ExpertWeights
from dsa_runtime.reference import fp8
from dsa_runtime.reference.indexer import ReferenceIndexer
from dsa_runtime.reference.kv_quant import ReferenceKVQuant
from dsa_runtime.reference.moe import ReferenceMoE
from dsa_runtime.reference.sparse_attn import ReferenceSparseAttn
from dsa_runtime.reference.topk import ReferenceTopK

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)"
    ),
]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _cuda(*xs):
    return [x.cuda() if isinstance(x, torch.Tensor) else x for x in xs]


def _same(cpu, gpu, exact: bool, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    if isinstance(cpu, tuple):
        for a, b in zip(cpu, gpu, strict=True):
            _same(a, b, exact, rtol, atol)
        return
    assert gpu.device.type == "cuda" and gpu.dtype == cpu.dtype and gpu.shape == cpu.shape
    gpu = gpu.cpu()
    if cpu.dtype == torch.float8_e4m3fn:  # compare the bytes: equality is not defined on e4m3
        cpu, gpu = cpu.view(torch.uint8), gpu.view(torch.uint8)
    if exact or cpu.dtype in (torch.uint8, torch.int32):
        assert torch.equal(gpu, cpu)
    else:
        torch.testing.assert_close(gpu, cpu, rtol=rtol, atol=atol)


@pytest.mark.parametrize("fmt", ["ue8m0", "float"])
def test_fp8_on_cuda(fmt):
    """Bit-identical: scales use a true division on both devices (also for "float")."""
    x = torch.randn(8, 512, generator=_gen(0)) * 3
    _same(fp8.quantize_blocks(x, fmt), fp8.quantize_blocks(x.cuda(), fmt), exact=True)
    w = torch.randn(2, 200, 300, generator=_gen(1))
    w8, s = fp8.block_quant_weight(w, fmt)
    _same((w8, s), fp8.block_quant_weight(w.cuda(), fmt), exact=True)
    _same(fp8.block_dequant_weight(w8, s), fp8.block_dequant_weight(w8.cuda(), s.cuda()), exact=True)


def test_indexer_on_cuda():
    idx, kv = ReferenceIndexer(), ReferenceKVQuant()
    g = _gen(2)
    q = torch.randn(10, 64, 128, generator=g).bfloat16()
    hw = torch.randn(10, 64, generator=g)
    k = torch.randn(30, 128, generator=g).bfloat16()
    q8, w = idx.quantize_q(q, hw)
    k8, ks = idx.quantize_k(k)
    _same((q8, w), idx.quantize_q(q.cuda(), hw.cuda()), exact=True)
    _same((k8, ks), idx.quantize_k(k.cuda()), exact=True)
    starts = torch.tensor([0] * 6 + [20] * 4, dtype=torch.int32)
    ends = torch.tensor([1, 2, 3, 4, 5, 5, 20, 22, 30, 20], dtype=torch.int32)
    cpu = idx.logits_ragged(q8, w, k8, ks, starts, ends)
    _same(cpu, idx.logits_ragged(*_cuda(q8, w, k8, ks, starts, ends)), exact=False)
    cache = torch.zeros(3, 16 * 132, dtype=torch.uint8)
    kv.store_index_k(cache, torch.arange(30) + 10, k8, ks)
    gpu_cache = torch.zeros(3, 16 * 132, dtype=torch.uint8, device="cuda")
    kv.store_index_k(gpu_cache, (torch.arange(30) + 10).cuda(), k8.cuda(), ks.cuda())
    _same(cache, gpu_cache, exact=True)
    # Two requests of N=2 queries over 3 pages of 16: request 1 uses the pages in the other order.
    paged = (
        q8[:4].view(2, 2, 64, 128),
        w[:4],
        cache,
        torch.tensor([36, 7], dtype=torch.int32),
        torch.tensor([[0, 1, 2], [2, 1, 0]], dtype=torch.int32),
    )
    _same(idx.logits_paged(*paged, 40), idx.logits_paged(*_cuda(*paged), 40), exact=False)


def test_topk_on_cuda():
    tk = ReferenceTopK()
    g = _gen(3)
    logits = torch.randn(20, 3000, generator=g).round(decimals=1)  # many ties
    starts = torch.randint(0, 1000, (20,), generator=g).int()
    ends = (starts + torch.randint(0, 2000, (20,), generator=g).int()).clamp(max=3000)
    page_table = torch.randperm(200, generator=g).int().view(4, 50)  # 50 pages of 64 cover 3000
    rows = torch.randint(0, 4, (20,), generator=g).int()
    cpu = tk.topk_transform(logits, starts, ends, 512, page_table, rows, 64)
    _same(cpu, tk.topk_transform(*_cuda(logits, starts, ends), 512, *_cuda(page_table, rows), 64), exact=True)


@pytest.mark.parametrize("layout", ["bf16", "fp8_656"])
def test_kv_quant_and_sparse_attn_on_cuda(layout):
    kv, attn = ReferenceKVQuant(), ReferenceSparseAttn()
    g = _gen(4)
    c = torch.randn(100, 512, generator=g).bfloat16()
    k_pe = torch.randn(100, 64, generator=g).bfloat16()
    slots = torch.randperm(128, generator=g)[:100]
    slots[::7] = -1
    shape, dtype = ((2, 64, 656), torch.uint8) if layout == "fp8_656" else ((2, 64, 576), torch.bfloat16)
    cache = torch.ones(shape, dtype=dtype)
    gpu_cache = cache.cuda()
    kv.store_mla(cache, slots, c, k_pe, layout=layout)
    kv.store_mla(gpu_cache, *_cuda(slots, c, k_pe), layout=layout)
    _same(cache, gpu_cache, exact=True)
    rows = kv.quantize_mla(c, k_pe, layout=layout)
    _same(kv.dequantize_mla(rows, layout=layout), kv.dequantize_mla(rows.cuda(), layout=layout), exact=True)
    q = torch.randn(3, 2, 128, 576, generator=g).bfloat16()
    indices = torch.randint(-1, 128, (3, 2, 64), generator=g).int()
    indices[1, 1] = -1
    cpu = attn.decode(q, cache, indices, 0.135234, layout=layout)
    _same(
        cpu,
        attn.decode(*_cuda(q, cache, indices), 0.135234, layout=layout),
        exact=False,
        rtol=1e-2,
        atol=1e-2,
    )
    flat = kv.dequantize_mla(cache.reshape(128, -1), layout=layout)
    cpu = attn.prefill(q[0], flat, indices[0], 0.135234)
    _same(cpu, attn.prefill(*_cuda(q[0], flat, indices[0]), 0.135234), exact=False, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("use_fp8", [False, True])
def test_moe_on_cuda(use_fp8):
    moe = ReferenceMoE()
    g = _gen(5)
    logits = torch.randn(16, 64, generator=g)
    bias = torch.randn(64, generator=g) * 0.1
    kw = {"top_k": 6, "n_group": 8, "topk_group": 3, "routed_scaling_factor": 2.5}
    w_cpu, ids_cpu = moe.route(logits, bias, **kw)
    w_gpu, ids_gpu = moe.route(logits.cuda(), bias.cuda(), **kw)
    _same(ids_cpu, ids_gpu, exact=True)
    _same(w_cpu, w_gpu, exact=False, rtol=1e-6, atol=1e-7)
    w13 = torch.randn(64, 160, 200, generator=g) * 0.05
    w2 = torch.randn(64, 200, 80, generator=g) * 0.05
    if use_fp8:
        (w13, s13), (w2, s2) = fp8.block_quant_weight(w13), fp8.block_quant_weight(w2)
        experts = ExpertWeights(w13, w2, s13, s2)
        gpu_experts = ExpertWeights(*_cuda(w13, w2, s13, s2))
    else:
        experts = ExpertWeights(w13.bfloat16(), w2.bfloat16())
        gpu_experts = ExpertWeights(*_cuda(w13.bfloat16(), w2.bfloat16()))
    x = torch.randn(16, 200, generator=g).bfloat16()
    ids_cpu[0, 0] = -1
    cpu = moe.experts(x, w_cpu, ids_cpu, experts)
    gpu = moe.experts(*_cuda(x, w_cpu, ids_cpu), gpu_experts)
    _same(cpu, gpu, exact=False, rtol=1e-2, atol=1e-2)
