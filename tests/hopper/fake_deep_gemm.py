"""A stand-in ``deep_gemm`` module in plain torch with DeepGEMM's call signatures (both API generations).

It computes what DeepGEMM's kernels compute from the same arguments, and like them leaves what the real kernels
leave unwritten as garbage (NaN here): the paged logits past the last computed position, padded rows of the
grouped GEMMs. So our adapters' layout translation and their own masking are what the tests exercise.

It also *enforces* what the real library trusts (DeepGEMM 54e2261, ``csrc/apis/attention.hpp``, ``gemm.hpp``,
``layout.hpp``, ``utils/layout.hpp``): dtypes, shapes, strides and contiguity, int32 lengths/indices, 16-byte
aligned TMA operands, schedule metadata made for the very lengths and SM count of the call, 128-row aligned
expert segments; a wrong layout fails here on CPU instead of crashing or misreading on the GPU. Its logits, as
the real ones, are views of a row-padded buffer (row stride a multiple of 1024 bytes), not contiguous tensors.
"""

from __future__ import annotations

import types

import torch

NAN = float("nan")
E4M3 = torch.float8_e4m3fn
NUM_SMS = 4
MK_ALIGN = 128


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(f"fake deep_gemm: {what}")  # DeepGEMM's DG_HOST_ASSERT (or worse: no check at all)


def _tma(t: torch.Tensor, name: str) -> None:
    _need(t.is_contiguous(), f"{name} must be contiguous, strides {t.stride()}")
    _need(t.data_ptr() % 16 == 0, f"{name} base must be 16-byte aligned for TMA (offset {t.data_ptr() % 16})")


def _int32_vec(t: torch.Tensor, n: int, name: str) -> None:
    _need(t.dtype == torch.int32 and t.dim() == 1 and t.shape[0] == n and t.is_contiguous(),
          f"{name} must be int32 [{n}] contiguous, got {t.dtype} {tuple(t.shape)} strides {t.stride()}")


def _padded_logits(rows: int, cols: int, row_align: int = 1) -> torch.Tensor:
    """``[rows, cols]`` NaN fp32 view of a buffer whose rows are padded to 256 fp32 (1024 bytes) and beyond."""
    stride = -(-(cols + 256) // 256) * 256
    return torch.full((-(-rows // row_align) * row_align, stride), NAN)[:rows, :cols]


def _check_q_weights(q: torch.Tensor, weights: torch.Tensor, rows: int) -> None:
    _need(q.dtype == E4M3, f"q must be e4m3, got {q.dtype}")
    _need(q.shape[-2] in (32, 64) and q.shape[-1] in (32, 64, 128), f"SM90: 32/64 heads of dim 32/64/128, got {tuple(q.shape)}")
    _tma(q, "q")
    _need(weights.dtype == torch.float32 and tuple(weights.shape) == (rows, q.shape[-2]),
          f"weights must be fp32 [{rows}, {q.shape[-2]}], got {weights.dtype} {tuple(weights.shape)}")
    _tma(weights, "weights")


def _mqa(q, k8, k_scale, weights):  # q [T, H, D] e4m3, k8 [S, D] e4m3 -> [T, S] fp32
    scores = torch.einsum("thd,sd->ths", q.float(), k8.float()) * k_scale.float()[None, None, :]
    return torch.einsum("ths,th->ts", scores.relu(), weights.float())


def _ragged(q, kv, weights, ks, ke, clean_logits):
    k8, k_scale = kv
    seq, heads, dim = q.shape
    _check_q_weights(q, weights, seq)
    _need(k8.dtype == E4M3 and k8.dim() == 2 and k8.shape[1] == dim, f"kv must be e4m3 [S, {dim}], got {k8.dtype} {tuple(k8.shape)}")
    _tma(k8, "kv")
    _need(k_scale.dtype == torch.float32 and tuple(k_scale.shape) == (k8.shape[0],),
          f"kv scale must be fp32 [S] (1-D), got {k_scale.dtype} {tuple(k_scale.shape)}")
    _tma(k_scale, "kv scale")
    _int32_vec(ks, seq, "cu_seq_len_k_start")
    _int32_vec(ke, seq, "cu_seq_len_k_end")
    _need(bool((ks >= 0).all() & (ke <= k8.shape[0]).all() & (ks <= ke).all()), "windows must satisfy 0 <= ks <= ke <= S")
    out = _padded_logits(seq, k8.shape[0], 128 // heads)
    out.copy_(_mqa(q, k8, k_scale, weights))
    if clean_logits:
        cols = torch.arange(k8.shape[0])
        inside = (cols[None, :] >= ks.long()[:, None]) & (cols[None, :] < ke.long()[:, None])
        out.masked_fill_(~inside, float("-inf"))
    return out


def _paged(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, two_d):
    batch, next_n, heads, dim = q.shape
    _check_q_weights(q, weights, batch * next_n)
    _need(kv_cache.dtype == torch.uint8 and kv_cache.dim() == 4, f"kv_cache must be uint8 4-D, got {kv_cache.dtype} {tuple(kv_cache.shape)}")
    blocks, block_kv, one, width = kv_cache.shape
    _need(block_kv == 64 and one == 1 and width == dim + 4, f"SM90 kv_cache is [blocks, 64, 1, {dim + 4}], got {tuple(kv_cache.shape)}")
    _need(kv_cache.stride(1) == width and kv_cache.stride(3) == 1 and kv_cache.stride(0) % 16 == 0
          and kv_cache.data_ptr() % 16 == 0, f"kv_cache strides {kv_cache.stride()} (need stride(1) == {width}, stride(3) == 1)")
    _need(block_table.dtype == torch.int32 and block_table.dim() == 2 and block_table.shape[0] == batch
          and block_table.stride(1) == 1, f"block_table must be int32 [{batch}, *] row-major, got {block_table.dtype} "
          f"{tuple(block_table.shape)} strides {block_table.stride()}")
    lens_shape = (batch, next_n) if two_d else (batch,)
    _need(context_lens.dtype == torch.int32 and tuple(context_lens.shape) == lens_shape and context_lens.is_contiguous(),
          f"context_lens must be int32 {lens_shape} contiguous, got {context_lens.dtype} {tuple(context_lens.shape)}")
    # The real kernel reads lengths as unsigned and writes up to them: both must fit the output row.
    _need(bool((context_lens >= 0).all()) and bool((context_lens <= max_context_len).all()), "lengths within [0, max_context_len]")
    _need(schedule_meta.dtype == torch.int32 and tuple(schedule_meta.shape) == (NUM_SMS + 1, 2) and schedule_meta.is_contiguous(),
          f"schedule_meta must be int32 [num_sms + 1, 2], got {schedule_meta.dtype} {tuple(schedule_meta.shape)}")
    _need(torch.equal(schedule_meta, _metadata(context_lens, block_kv, NUM_SMS)), "schedule_meta was not made for these lengths")
    _need(all(t.device == q.device for t in (kv_cache, weights, context_lens, block_table, schedule_meta)), "one device")
    flat = kv_cache.reshape(blocks, block_kv * width)
    values = flat[:, : block_kv * dim].reshape(blocks, block_kv, dim).view(E4M3)
    scales = flat[:, block_kv * dim :].contiguous().view(torch.float32).reshape(blocks, block_kv)
    out = _padded_logits(batch * next_n, max_context_len)
    for b in range(batch):
        # The real kernel computes up to the request's (last query's) length for every query.
        length = int(context_lens[b, -1] if two_d else context_lens[b])
        pos = torch.arange(length)
        page = block_table[b].long()[pos // block_kv]
        _need(bool(((page >= 0) & (page < blocks)).all()), f"block_table[{b}] points outside the cache")
        k8, ks = values[page, pos % block_kv], scales[page, pos % block_kv]
        rows = slice(b * next_n, (b + 1) * next_n)
        out[rows, :length] = _mqa(q[b], k8, ks, weights[rows])
    return out


def _check_b(b8, b_s, groups, name):
    _need(b8.dtype == E4M3 and b8.dim() == 3 and (groups is None or b8.shape[0] == groups),
          f"{name} must be e4m3 [G, N, K], got {b8.dtype} {tuple(b8.shape)}")
    _tma(b8, name)
    n, k = b8.shape[1:]
    want = (b8.shape[0], -(-n // 128), -(-k // 128))
    _need(b_s.dtype == torch.float32 and tuple(b_s.shape) == want and b_s.is_contiguous(),
          f"{name} scale must be fp32 {want} contiguous, got {b_s.dtype} {tuple(b_s.shape)} strides {b_s.stride()}")
    _need(k % 128 == 0, f"K = {k} must be a multiple of 128")


def _check_a(a8, a_s, k, name):
    _need(a8.dtype == E4M3 and a8.shape[-1] == k, f"{name} must be e4m3 [.., {k}], got {a8.dtype} {tuple(a8.shape)}")
    _tma(a8, name)
    want = (*a8.shape[:-1], k // 128)
    _need(a_s.dtype == torch.float32 and tuple(a_s.shape) == want, f"{name} scale must be fp32 {want}, got {a_s.dtype} {tuple(a_s.shape)}")


def _dequant_rows(a, a_scale):  # [M, K] e4m3, [M, K/128] -> fp32
    return a.float() * a_scale.float().repeat_interleave(128, dim=-1)[..., : a.shape[-1]]


def _dequant_weight(b, b_scale):  # [N, K] e4m3, [N/128, K/128]
    s = b_scale.float().repeat_interleave(128, dim=0)[: b.shape[0]].repeat_interleave(128, dim=1)[:, : b.shape[1]]
    return b.float() * s


def _contiguous(a, b, d, m_indices, *args, **kwargs):
    (a8, a_s), (b8, b_s) = a, b
    _check_b(b8, b_s, None, "b")
    _check_a(a8, a_s, b8.shape[2], "a")
    rows = a8.shape[0]
    _need(d.dtype == torch.bfloat16 and tuple(d.shape) == (rows, b8.shape[1]) and d.stride(-1) == 1,
          f"d must be bf16 [{rows}, {b8.shape[1]}] N-major, got {d.dtype} {tuple(d.shape)}")
    _tma(d, "d")
    _int32_vec(m_indices, rows, "m_indices")
    _need(rows % MK_ALIGN == 0, f"M = {rows} must be a multiple of the contiguous alignment {MK_ALIGN}")
    # One expert per 128-row block (the kernel takes a block's expert from its first row): -1 only as padding.
    blk = m_indices.view(-1, MK_ALIGN).long()
    first = blk[:, :1]
    _need(bool(((blk == first) | (blk == -1)).all()), "an aligned block mixes experts")
    # Validity is read per 64-row WGMMA step from its first row (scheduler/gemm.cuh is_computation_valid): the
    # expert's rows must be a prefix of the block, the -1 padding after them.
    valid = (blk >= 0).int()
    _need(bool((valid[:, 1:] <= valid[:, :-1]).all()), "expert rows must come first in a block, -1 padding after")
    _need(bool((blk < b8.shape[0]).all()), "m_indices past the expert count")
    d.fill_(NAN)
    for e in torch.unique(m_indices[m_indices >= 0]).tolist():
        rows_e = torch.nonzero(m_indices == e).squeeze(1)
        d[rows_e] = (_dequant_rows(a8[rows_e], a_s[rows_e]) @ _dequant_weight(b8[e], b_s[e]).T).to(d.dtype)


def _masked(a, b, d, masked_m, expected_m, *args, **kwargs):
    (a8, a_s), (b8, b_s) = a, b
    _need(a8.dim() == 3, f"a must be [G, M, K], got {tuple(a8.shape)}")
    groups, max_m, k = a8.shape
    _check_b(b8, b_s, groups, "b")
    _check_a(a8, a_s, b8.shape[2], "a")
    _need(d.dtype == torch.bfloat16 and tuple(d.shape) == (groups, max_m, b8.shape[1]), f"d must be bf16 [G, M, N], got {tuple(d.shape)}")
    _tma(d, "d")
    _int32_vec(masked_m, groups, "masked_m")
    _need(isinstance(expected_m, int) and expected_m > 0, f"expected_m must be a positive int, got {expected_m!r}")
    _need(bool(((masked_m >= 0) & (masked_m <= max_m)).all()), "masked_m within [0, M]")
    d.fill_(NAN)
    for e in range(groups):
        m = int(masked_m[e])
        if m:
            d[e, :m] = (_dequant_rows(a8[e, :m], a_s[e, :m]) @ _dequant_weight(b8[e], b_s[e]).T).to(d.dtype)


def _metadata(context_lens, block_kv, num_sms, indices=None):
    """A fingerprint of the lengths and SM count (the real one is a per-SM schedule of the same shape)."""
    _need(block_kv == 64 and num_sms == NUM_SMS, f"metadata for block_kv 64 and {NUM_SMS} SMs, got {block_kv}, {num_sms}")
    _need(context_lens.dtype == torch.int32 and context_lens.is_contiguous(), "metadata lengths must be int32 contiguous")
    meta = torch.zeros(num_sms + 1, 2, dtype=torch.int32)
    meta[:, 0] = torch.arange(num_sms + 1, dtype=torch.int32) * int(context_lens.sum())
    meta[num_sms, 1] = context_lens.numel() * 1000 + context_lens.dim()
    return meta


def make_module(generation: str) -> types.ModuleType:
    """A fake ``deep_gemm`` of one API generation: ``"fp8"`` (2025-10) or ``"fp8_fp4"`` (2026)."""
    m = types.ModuleType("deep_gemm")
    m.__version__ = "0.0-fake-" + generation
    m.get_num_sms = lambda: NUM_SMS
    m.get_mk_alignment_for_contiguous_layout = lambda: MK_ALIGN
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
