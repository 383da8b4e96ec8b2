"""The steps of tools/gpu/diag_deepgemm.py; each returns ``(status, detail)`` and runs in its own process.

The ``dg_*`` steps build their inputs as DeepGEMM's tests at 54e2261 do (tests/test_attention.py,
tests/generators.py): plain e4m3 queries, per-token fp32 key scales, the fused ``[blocks, 64, 1, 132]`` uint8
cache, 2-D context lengths and ``get_paged_mqa_logits_metadata(lens, 64, get_num_sms())``, per-token x 128
activation scales and 128 x 128 weight scales in fp32 (DeepGEMM makes the TMA layout itself), ``int32``
``m_indices`` with ``-1`` padding to ``get_mk_alignment_for_contiguous_layout()``, ``masked_m`` int32.
"""

from __future__ import annotations

import os
import time

import torch

E4M3 = torch.float8_e4m3fn
DEV = os.environ.get("DG_DIAG_DEVICE", "cuda")  # "cpu" with a fake deep_gemm: smoke test of these steps


def _sync() -> None:
    if DEV != "cpu":
        torch.cuda.synchronize()


def _timed(fn):  # noqa: ANN001, ANN202
    """Run ``fn`` twice: (result, first call s (JIT compile + load + run), second call ms)."""
    t0 = time.time()
    out = fn()
    _sync()
    first = time.time() - t0
    t1 = time.time()
    fn()
    _sync()
    print(f"  > first call {first:.1f} s (JIT compile + load), again {(time.time() - t1) * 1e3:.2f} ms", flush=True)
    return out


def _calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's similarity measure: ``1 - 2 sum(xy) / sum(x^2 + y^2)``."""
    x, y = x.double(), y.double()
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum().clamp_min(1e-30))


def _compare(got: torch.Tensor, want: torch.Tensor, valid: torch.Tensor | None = None, tol: float = 1e-4):
    """Values where ``valid`` (default: where ``want`` is finite); -inf pattern equal when ``valid`` is None."""
    got, want = got.float(), want.float()
    if valid is None:
        if not torch.equal(torch.isinf(got), torch.isinf(want)):
            bad = int((torch.isinf(got) != torch.isinf(want)).sum())
            return "mismatch", f"-inf pattern differs at {bad} entries"
        valid = torch.isfinite(want)
    g, w = got[valid], want[valid]
    if not bool(torch.isfinite(g).all()):
        return "mismatch", f"{int((~torch.isfinite(g)).sum())} non-finite values where the reference is finite"
    err = float((g - w).abs().max()) if g.numel() else 0.0
    scale = float(w.abs().max()) if w.numel() else 1.0
    diff = _calc_diff(g, w) if g.numel() else 0.0
    detail = f"max abs err {err:.3g} (ref max {scale:.3g}), calc_diff {diff:.2e}, {g.numel()} values"
    return ("ok" if diff < tol else "mismatch"), detail


def _per_token_128(x: torch.Tensor):
    """``[..., K]`` -> e4m3 and fp32 scales ``[..., K / 128]`` (DeepGEMM's per_token_cast_to_fp8, float)."""
    xv = x.float().unflatten(-1, (-1, 128))
    s = xv.abs().amax(-1, keepdim=True).clamp(1e-4) / 448.0
    return (xv / s).to(E4M3).flatten(-2), s.squeeze(-1).contiguous()


def _per_block_128(w: torch.Tensor):
    """``[G, N, K]`` (N, K multiples of 128) -> e4m3 and fp32 ``[G, N / 128, K / 128]`` (per_block_cast_to_fp8)."""
    g, n, k = w.shape
    wv = w.float().view(g, n // 128, 128, k // 128, 128)
    s = wv.abs().amax((2, 4), keepdim=True).clamp(1e-4) / 448.0
    return (wv / s).to(E4M3).view(g, n, k), s.view(g, n // 128, k // 128).contiguous()


def _deq_rows(a8: torch.Tensor, sa: torch.Tensor) -> torch.Tensor:
    return a8.float() * sa.repeat_interleave(128, dim=-1)


def _deq_block(b8: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    return b8.float() * sb.repeat_interleave(128, dim=-2).repeat_interleave(128, dim=-1)


# ------------------------------------------------------------------------------------------- environment
def step_import():
    t0 = time.time()
    import deep_gemm

    from dsa_runtime.plugins.cuda_hopper.deepgemm_api import detect_generation

    cap = torch.cuda.get_device_capability() if DEV != "cpu" else ("cpu", "")
    return "ok", (f"deep_gemm {deep_gemm.__version__} from {getattr(deep_gemm, '__file__', '?')} in {time.time() - t0:.1f} s; "
                  f"generation {detect_generation(deep_gemm)}; sm {cap[0]}{cap[1]}, {deep_gemm.get_num_sms()} SMs; "
                  f"mk alignment {deep_gemm.get_mk_alignment_for_contiguous_layout()}; torch {torch.__version__} "
                  f"cuda {torch.version.cuda}")


def step_cublaslt():
    import deep_gemm

    a = torch.randn(128, 256, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(192, 256, device=DEV, dtype=torch.bfloat16)
    d = torch.empty(128, 192, device=DEV, dtype=torch.bfloat16)
    _timed(lambda: deep_gemm.cublaslt_gemm_nt(a, b, d))
    return _compare(d, a.float() @ b.float().T, tol=1e-3)


def step_jit_transpose():
    import deep_gemm

    sf = torch.rand(300, 4, device=DEV) + 0.5
    out = _timed(lambda: deep_gemm.get_mn_major_tma_aligned_tensor(sf))
    status, detail = _compare(out, sf, tol=1e-12)
    return status, f"{detail}; strides {tuple(out.stride())}"


# ------------------------------------------------------------------------------- DeepGEMM's own calls
def step_dg_mqa_logits():
    import deep_gemm as dg

    torch.manual_seed(0)
    t, s, h, d = 64, 512, 64, 128
    q8 = torch.randn(t, h, d, device=DEV, dtype=torch.bfloat16).to(E4M3)
    kv = torch.randn(s, d, device=DEV, dtype=torch.bfloat16)
    sf = kv.float().abs().amax(1).clamp(1e-4) / 448.0  # per_custom_dims_cast_to_fp8(kv, (0,), False)
    kv8 = (kv.float() / sf[:, None]).to(E4M3)
    w = torch.randn(t, h, device=DEV, dtype=torch.float32)
    ks = torch.zeros(t, dtype=torch.int32, device=DEV)
    ke = torch.arange(t, dtype=torch.int32, device=DEV) + (s - t)
    if hasattr(dg, "fp8_fp4_mqa_logits"):
        call = lambda: dg.fp8_fp4_mqa_logits((q8, None), (kv8, sf), w, ks, ke, clean_logits=True,  # noqa: E731
                                             max_seqlen_k=0, logits_dtype=torch.float32)
    else:
        call = lambda: dg.fp8_mqa_logits(q8, (kv8, sf), w, ks, ke, clean_logits=True)  # noqa: E731
    out = _timed(call)
    score = torch.einsum("thd,sd->ths", q8.float(), kv8.float() * sf[:, None]).relu()
    ref = torch.einsum("ths,th->ts", score, w)
    cols = torch.arange(s, device=DEV)
    ref = ref.masked_fill(~((cols[None] >= ks[:, None]) & (cols[None] < ke[:, None])), float("-inf"))
    return _compare(out, ref)


def step_dg_paged_mqa_logits():
    import deep_gemm as dg

    torch.manual_seed(1)
    b, n, h, d, blk = 4, 2, 64, 128, 64
    lens = torch.randint(100, 600, (b,), dtype=torch.int32, device=DEV)
    nblk = (lens + blk - 1) // blk
    total, max_blocks = int(nblk.sum()), int(nblk.max())
    kv = torch.randn(total, blk, 1, d, device=DEV, dtype=torch.bfloat16)
    sf = kv.float().abs().amax(3, keepdim=True).clamp(1e-4) / 448.0
    kv8 = (kv.float() / sf).to(E4M3)
    fused = torch.empty(total, blk * (d + 4), dtype=torch.uint8, device=DEV)
    fused[:, : blk * d] = kv8.view(total, blk * d).view(torch.uint8)
    fused[:, blk * d :] = sf.reshape(total, blk).view(torch.uint8)
    kv_cache = fused.view(total, blk, 1, d + 4)
    table = torch.zeros(b, max_blocks, dtype=torch.int32, device=DEV)
    perm, off = torch.randperm(total, device=DEV).to(torch.int32), 0
    for i, nb in enumerate(nblk.tolist()):
        table[i, :nb] = perm[off : off + nb]
        off += nb
    lens2d = (lens[:, None] - n + 1 + torch.arange(n, device=DEV, dtype=torch.int32)[None]).to(torch.int32).contiguous()
    max_len = max_blocks * blk
    q8 = torch.randn(b, n, h, d, device=DEV, dtype=torch.bfloat16).to(E4M3)
    w = torch.randn(b * n, h, device=DEV, dtype=torch.float32)
    meta = dg.get_paged_mqa_logits_metadata(lens2d, blk, dg.get_num_sms())
    if hasattr(dg, "fp8_fp4_paged_mqa_logits"):
        call = lambda: dg.fp8_fp4_paged_mqa_logits((q8, None), kv_cache, w, lens2d, table, meta, max_len,  # noqa: E731
                                                   clean_logits=False, logits_dtype=torch.float32)
    else:
        call = lambda: dg.fp8_paged_mqa_logits(q8, kv_cache, w, lens2d, table, meta, max_len, clean_logits=False)  # noqa: E731
    out = _timed(call)
    kdeq = (kv8.float() * sf).view(total, blk, d)
    ref = torch.zeros(b * n, max_len, device=DEV)
    for i, nb in enumerate(nblk.tolist()):
        k = kdeq[table[i, :nb].long()].reshape(-1, d)
        s = torch.einsum("nhd,pd->nhp", q8[i].float(), k).relu() * w[i * n : (i + 1) * n, :, None]
        ref[i * n : (i + 1) * n, : nb * blk] = s.sum(1)
    valid = torch.arange(max_len, device=DEV)[None] < lens2d.view(-1, 1)
    return _compare(out, ref, valid)


def _grouped_inputs(groups: int, n: int, k: int):
    b = torch.randn(groups, n, k, device=DEV, dtype=torch.bfloat16)
    b8, sb = _per_block_128(b)
    return b8, sb, _deq_block(b8, sb)


def step_dg_contiguous():
    import deep_gemm as dg

    torch.manual_seed(2)
    groups, n, k = 4, 256, 256
    align = dg.get_mk_alignment_for_contiguous_layout()
    actual = torch.randint(60, 200, (groups,)).tolist()
    aligned = [-(-m // align) * align for m in actual]
    m = sum(aligned)
    a = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    m_idx = torch.empty(m, dtype=torch.int32, device=DEV)
    start = 0
    for g, (am, al) in enumerate(zip(actual, aligned, strict=True)):
        m_idx[start : start + am] = g
        m_idx[start + am : start + al] = -1
        a[start + am : start + al] = 0
        start += al
    a8, sa = _per_token_128(a)
    b8, sb, bdeq = _grouped_inputs(groups, n, k)
    d = torch.empty(m, n, device=DEV, dtype=torch.bfloat16)
    fn = getattr(dg, "m_grouped_fp8_gemm_nt_contiguous", None) or dg.m_grouped_fp8_fp4_gemm_nt_contiguous
    _timed(lambda: fn((a8, sa), (b8, sb), d, m_idx, disable_ue8m0_cast=True))
    valid = m_idx >= 0
    ref = torch.zeros(m, n, device=DEV)
    for g in range(groups):
        rows = m_idx == g
        ref[rows] = _deq_rows(a8[rows], sa[rows]) @ bdeq[g].T
    return _compare(d[valid], ref[valid], tol=1e-3)


def step_dg_masked():
    import deep_gemm as dg

    torch.manual_seed(3)
    groups, max_m, n, k, expected = 4, 128, 256, 256, 48
    a = torch.randn(groups, max_m, k, device=DEV, dtype=torch.bfloat16)
    a8, sa = _per_token_128(a)
    masked_m = torch.randint(10, 90, (groups,), dtype=torch.int32, device=DEV)
    for g in range(groups):
        sa[g, int(masked_m[g]) :] = 0  # as generate_m_grouped_masked does
    b8, sb, bdeq = _grouped_inputs(groups, n, k)
    d = torch.empty(groups, max_m, n, device=DEV, dtype=torch.bfloat16)
    _timed(lambda: dg.m_grouped_fp8_gemm_nt_masked((a8, sa), (b8, sb), d, masked_m, expected, disable_ue8m0_cast=True))
    got, want = [], []
    for g in range(groups):
        mm = int(masked_m[g])
        got.append(d[g, :mm])
        want.append(_deq_rows(a8[g, :mm], sa[g, :mm]) @ bdeq[g].T)
    return _compare(torch.cat(got), torch.cat(want), tol=1e-3)


# ------------------------------------------------------------------------------------- our adapters
def _quantizer():
    import importlib.util

    if DEV != "cpu" and importlib.util.find_spec("triton") is not None:
        from dsa_runtime.plugins.cuda_hopper.triton.indexer import TritonIndexer

        return TritonIndexer(), "triton"
    from dsa_runtime.reference.indexer import ReferenceIndexer  # no triton (CPU smoke run): the reference

    return ReferenceIndexer(), "reference"


def step_our_ragged():
    from dsa_runtime.plugins.cuda_hopper.deepgemm_indexer import DeepGEMMIndexer
    from dsa_runtime.reference.indexer import ReferenceIndexer

    torch.manual_seed(4)
    quant, qname = _quantizer()
    t, s, h = 48, 300, 64
    q8, w = quant.quantize_q(torch.randn(t, h, 128, device=DEV, dtype=torch.bfloat16), torch.randn(t, h, device=DEV))
    k8, k_scale = quant.quantize_k(torch.randn(s, 128, device=DEV, dtype=torch.bfloat16))
    ks = (torch.arange(t, device=DEV) * 5 - 40).clamp(0, s).to(torch.int32)
    ke = (ks + torch.randint(0, 220, (t,), device=DEV)).clamp(max=s).to(torch.int32)
    ke[3] = ks[3]  # an empty window
    got = _timed(lambda: DeepGEMMIndexer().logits_ragged(q8, w, k8, k_scale, ks, ke))
    status, detail = _compare(got, ReferenceIndexer().logits_ragged(q8, w, k8, k_scale, ks, ke))
    return status, f"{detail} (quantized by {qname})"


def step_our_paged():
    from dsa_runtime.plugins.cuda_hopper.deepgemm_indexer import DeepGEMMIndexer
    from dsa_runtime.reference.indexer import ReferenceIndexer

    torch.manual_seed(5)
    quant, qname = _quantizer()
    pages, b, n, h = 16, 3, 2, 64
    k8, scale = quant.quantize_k(torch.randn(pages * 64, 128, device=DEV, dtype=torch.bfloat16))
    cache = torch.cat([k8.view(torch.uint8).reshape(pages, -1), scale.float().view(torch.uint8).reshape(pages, -1)], 1)
    table = torch.randperm(pages, device=DEV)[: b * 5].view(b, 5).to(torch.int32)
    lens = torch.tensor([150, 1, 317], dtype=torch.int32, device=DEV)
    q8, w = quant.quantize_q(torch.randn(b * n, h, 128, device=DEV, dtype=torch.bfloat16),
                             torch.randn(b * n, h, device=DEV))
    q8 = q8.view(b, n, h, 128)
    got = _timed(lambda: DeepGEMMIndexer().logits_paged(q8, w, cache, lens, table, 320))
    status, detail = _compare(got, ReferenceIndexer().logits_paged(q8, w, cache, lens, table, 320))
    return status, f"{detail} (quantized by {qname})"


def _experts(n_exp: int, dim: int, inter: int, seed: int):
    from dsa_runtime.families import ExpertWeights

    gen = torch.Generator(device=DEV).manual_seed(seed)
    w13 = (torch.randn(n_exp, 2 * inter, dim, generator=gen, device=DEV) * 8).to(E4M3)
    w2 = (torch.randn(n_exp, dim, inter, generator=gen, device=DEV) * 8).to(E4M3)
    s13 = torch.rand(n_exp, 2 * inter // 128, dim // 128, generator=gen, device=DEV) * 0.01 + 0.001
    s2 = torch.rand(n_exp, dim // 128, inter // 128, generator=gen, device=DEV) * 0.01 + 0.001
    return ExpertWeights(w13, w2, s13, s2)


def _moe(tokens: int, masked_max: int):
    from dsa_runtime.plugins.cuda_hopper.deepgemm_moe import DeepGEMMMoE
    from dsa_runtime.reference.moe import ReferenceMoE

    torch.manual_seed(6)
    n_exp, dim, inter, top_k = 8, 256, 128, 4
    routed, shared = _experts(n_exp, dim, inter, 1), _experts(1, dim, inter, 2)
    x = torch.randn(tokens, dim, device=DEV).to(torch.bfloat16)
    ids = torch.rand(tokens, n_exp, device=DEV).argsort(1)[:, :top_k].to(torch.int32)
    wts = torch.rand(tokens, top_k, device=DEV) + 0.2
    moe = DeepGEMMMoE("ue8m0", masked_max_tokens=masked_max, check_ids=False)
    got = _timed(lambda: moe.experts(x, wts, ids, routed, shared)).float()
    want = ReferenceMoE().experts(x, wts, ids, routed, shared).float()
    err = float(((got - want).norm(dim=1) / want.norm(dim=1).clamp_min(1e-6)).max())
    path = "masked" if tokens <= masked_max else "contiguous"
    ok = bool(torch.isfinite(got).all()) and err < 0.12  # the kit's moe.out_fp8 bound
    return ("ok" if ok else "mismatch"), f"{path} path, {tokens} tokens: max row rel L2 err {err:.3g} (bound 0.12)"


def step_our_moe_contiguous():
    return _moe(200, 0)


def step_our_moe_masked():
    return _moe(8, 64)


STEPS = {name[len("step_"):]: fn for name, fn in globals().items() if name.startswith("step_")}
