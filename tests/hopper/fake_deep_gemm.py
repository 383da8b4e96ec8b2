"""A stand-in ``deep_gemm`` module in plain torch with DeepGEMM's call signatures (both API generations).

It computes what DeepGEMM's kernels compute from the same arguments, and like them leaves what the real kernels
leave unwritten as garbage (NaN here): the paged logits past the last computed position, padded rows of the
grouped GEMMs. So our adapters' layout translation and their own masking are what the tests exercise.
"""

from __future__ import annotations

import types

import torch

NAN = float("nan")


def _mqa(q, k8, k_scale, weights):  # q [T, H, D] e4m3, k8 [S, D] e4m3 -> [T, S] fp32
    scores = torch.einsum("thd,sd->ths", q.float(), k8.float()) * k_scale.float()[None, None, :]
    return torch.einsum("ths,th->ts", scores.relu(), weights.float())


def _ragged(q, kv, weights, ks, ke, clean_logits):
    k8, k_scale = kv
    out = _mqa(q, k8, k_scale, weights)
    if clean_logits:
        cols = torch.arange(k8.shape[0])
        inside = (cols[None, :] >= ks.long()[:, None]) & (cols[None, :] < ke.long()[:, None])
        out = torch.where(inside, out, float("-inf"))
    return out


def _paged(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, two_d):
    batch, next_n, heads, dim = q.shape
    blocks, block_kv, one, width = kv_cache.shape
    assert block_kv == 64 and one == 1 and width == dim + 4 and kv_cache.dtype == torch.uint8
    assert schedule_meta.shape[1] == 2 and block_table.dtype == torch.int32
    assert context_lens.dim() == (2 if two_d else 1)
    # The real kernel reads lengths as unsigned and writes up to them: both must fit the output row.
    assert bool((context_lens >= 0).all()) and bool((context_lens <= max_context_len).all())
    flat = kv_cache.reshape(blocks, block_kv * width)
    values = flat[:, : block_kv * dim].reshape(blocks, block_kv, dim).view(torch.float8_e4m3fn)
    scales = flat[:, block_kv * dim :].contiguous().view(torch.float32).reshape(blocks, block_kv)
    out = torch.full((batch * next_n, max_context_len), NAN)
    for b in range(batch):
        # The real kernel computes up to the request's (last query's) length for every query.
        length = int(context_lens[b, -1] if two_d else context_lens[b])
        length = min(length, max_context_len)
        pos = torch.arange(length)
        page = block_table[b].long()[pos // block_kv]
        k8, ks = values[page, pos % block_kv], scales[page, pos % block_kv]
        rows = slice(b * next_n, (b + 1) * next_n)
        out[rows, :length] = _mqa(q[b], k8, ks, weights[rows])
    return out


def _dequant_rows(a, a_scale):  # [M, K] e4m3, [M, K/128] -> fp32
    return a.float() * a_scale.float().repeat_interleave(128, dim=-1)[..., : a.shape[-1]]


def _dequant_weight(b, b_scale):  # [N, K] e4m3, [N/128, K/128]
    s = b_scale.float().repeat_interleave(128, dim=0)[: b.shape[0]].repeat_interleave(128, dim=1)[:, : b.shape[1]]
    return b.float() * s


def _contiguous(a, b, d, m_indices, *args, **kwargs):
    (a8, a_s), (b8, b_s) = a, b
    assert m_indices.dtype == torch.int32 and m_indices.shape[0] == a8.shape[0] == d.shape[0]
    d.fill_(NAN)
    for e in torch.unique(m_indices[m_indices >= 0]).tolist():
        rows = torch.nonzero(m_indices == e).squeeze(1)
        d[rows] = (_dequant_rows(a8[rows], a_s[rows]) @ _dequant_weight(b8[e], b_s[e]).T).to(d.dtype)


def _masked(a, b, d, masked_m, expected_m, *args, **kwargs):
    (a8, a_s), (b8, b_s) = a, b
    assert a8.dim() == 3 and d.shape[:2] == a8.shape[:2] and masked_m.dtype == torch.int32 and expected_m >= 1
    d.fill_(NAN)
    for e in range(a8.shape[0]):
        m = int(masked_m[e])
        if m:
            d[e, :m] = (_dequant_rows(a8[e, :m], a_s[e, :m]) @ _dequant_weight(b8[e], b_s[e]).T).to(d.dtype)


def _metadata(context_lens, block_kv, num_sms, indices=None):
    assert block_kv == 64
    return torch.zeros(num_sms + 1, 2, dtype=torch.int32)


def make_module(generation: str) -> types.ModuleType:
    """A fake ``deep_gemm`` of one API generation: ``"fp8"`` (2025-10) or ``"fp8_fp4"`` (2026)."""
    m = types.ModuleType("deep_gemm")
    m.__version__ = "0.0-fake-" + generation
    m.get_num_sms = lambda: 4
    m.get_mk_alignment_for_contiguous_layout = lambda: 128
    m.get_paged_mqa_logits_metadata = _metadata
    m.m_grouped_fp8_gemm_nt_masked = _masked
    if generation == "fp8":
        m.fp8_mqa_logits = lambda q, kv, w, ks, ke, clean_logits=True: _ragged(q, kv, w, ks, ke, clean_logits)
        m.fp8_paged_mqa_logits = lambda q, kv, w, lens, table, meta, max_len, clean_logits=False: _paged(
            q, kv, w, lens, table, meta, max_len, two_d=False
        )
        m.m_grouped_fp8_gemm_nt_contiguous = _contiguous
        return m

    def mqa(q, kv, w, ks, ke, clean_logits=True, max_seqlen_k=0, logits_dtype=torch.float32):
        q8, sf = q
        assert sf is None and logits_dtype == torch.float32
        return _ragged(q8, kv, w, ks, ke, clean_logits)

    def paged(q, kv, w, lens, table, meta, max_len, clean_logits=False, logits_dtype=torch.float32, indices=None):
        q8, sf = q
        assert sf is None and logits_dtype == torch.float32 and not clean_logits  # refused with 2-D lengths
        return _paged(q8, kv, w, lens, table, meta, max_len, two_d=True)

    m.fp8_fp4_mqa_logits, m.fp8_fp4_paged_mqa_logits = mqa, paged
    m.m_grouped_fp8_fp4_gemm_nt_contiguous = _contiguous  # the fp8_* alias is absent on purpose
    m.m_grouped_fp8_fp4_gemm_nt_masked = _masked
    return m
