"""Indexer logits ``I[t, s] = k_scale[s] * sum_h w[t, h] * relu(q8[t, h] . k8[s])`` as FP8 tensor-core GEMMs.

The core step (:func:`_head_sum`) takes a key tile ``[BLOCK_N, 128]`` e4m3 and the queries of ``QPD`` rows
``[QPD * HP, 128]`` (``HP`` = heads padded to a power of two >= 16, padding rows zero) and computes
``S = k @ q^T`` ``[BLOCK_N, QPD * HP]`` in one fp8 ``tl.dot`` (fp32 accumulate), then ``relu(S) * w``
reduced over each row's ``HP`` columns -> ``[BLOCK_N, QPD]``. Keys are the MMA's M side so the head sum
runs along the accumulator's N axis, inside a warp's quad (no shared-memory round trip); a zero-padded
head adds ``relu(0) * 0``.

* Ragged prefill (:func:`logits_ragged`): program per (``BLOCK_M`` query rows, ``BLOCK_N`` keys); the key
  tile is loaded once and reused by ``BLOCK_M / QPD`` dots. A tile no row of the block can see (outside
  ``[min ks, max ke)``) only writes ``-inf``.
* Paged decode (:func:`logits_paged`): program per (request, ``STEPS * BLOCK_N`` positions, ``STEPS`` from
  :func:`paged_steps`); the ``N`` MTP
  queries of the request ride in the same dot (``QPD = N``), so every key byte is read once. Keys and
  scales are gathered per position from the ``index_k_132`` pages (``page * P * 132 + off * 128`` and
  ``page * P * 132 + P * 128 + 4 * off``), so any page size works; no host sync, shapes only from
  arguments (CUDA-graph capturable).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from dsa_runtime.plugins.cuda_hopper.triton.mla_fp8_decode import sm_count

D = 128
NEG_INF = float("-inf")


@dataclass(frozen=True)
class RaggedConfig:
    """Launch shape of the ragged kernel: ``block_m`` query rows x ``block_n`` keys per program, ``qpd``
    query rows per dot (``qpd * HP <= 256``); ``imprecise_acc``: see :func:`_head_sum`."""

    block_m: int = 16
    block_n: int = 128
    qpd: int = 1
    num_warps: int = 4
    num_stages: int = 2
    imprecise_acc: int | None = None


@dataclass(frozen=True)
class PagedConfig:
    """Launch shape of the paged kernel: ``block_n`` positions per step, at most ``steps`` per program (halved,
    down to 1, while a request's programs times the batch stay under ``min_programs_per_sm`` x the SMs; 0 keeps
    ``steps``). The step count is a runtime argument: batch and context changes never recompile.

    Default from the H200 sweep (2026-11-26, ``bench/indexer_triton.py --paged-sweep``): 128 positions x 16
    steps on 4 warps read 64 x 128K at 82% of copy bandwidth (0.319 ms) where 64 x 8 on 8 warps reached 54%:
    the H200 had moved the H100's bytes per second, so the copies in flight, not the bandwidth, bounded it."""

    block_n: int = 128
    steps: int = 16
    num_warps: int = 4
    num_stages: int = 2
    imprecise_acc: int | None = None
    min_programs_per_sm: int = 4


RAGGED_CONFIGS = {
    "m16n128q1": RaggedConfig(16, 128, 1, 4, 2),
    "m16n128q2": RaggedConfig(16, 128, 2, 8, 2),
    "m32n128q4": RaggedConfig(32, 128, 4, 8, 2),
    "m16n256q1": RaggedConfig(16, 256, 1, 8, 2),
    "m32n256q2": RaggedConfig(32, 256, 2, 8, 2),
    "m64n128q2": RaggedConfig(64, 128, 2, 8, 3),
    "m16n128q1p": RaggedConfig(16, 128, 1, 4, 2, imprecise_acc=32),
}
PAGED_CONFIGS = {  # fixed step counts (min_programs_per_sm 0) unless named "auto"
    "n64s8w8": PagedConfig(64, 8, 8, 2, min_programs_per_sm=0),  # the default until 2026-11-26
    "n64s4w4": PagedConfig(64, 4, 4, 2, min_programs_per_sm=0),
    "n64s32w4s3": PagedConfig(64, 32, 4, 3, min_programs_per_sm=0),
    "n128s4w8": PagedConfig(128, 4, 8, 2, min_programs_per_sm=0),
    "n128s8w4": PagedConfig(128, 8, 4, 2, min_programs_per_sm=0),
    "n128s16w4": PagedConfig(128, 16, 4, 2, min_programs_per_sm=0),
    "n128s32w4": PagedConfig(128, 32, 4, 2, min_programs_per_sm=0),
    "n256s4w8": PagedConfig(256, 4, 8, 2, min_programs_per_sm=0),
    "n256s8w8": PagedConfig(256, 8, 8, 2, min_programs_per_sm=0),
    "n128s16w4auto8": PagedConfig(128, 16, 4, 2, min_programs_per_sm=8),
    "n64s4w4p": PagedConfig(64, 4, 4, 2, imprecise_acc=32, min_programs_per_sm=0),
}


def paged_steps(cfg: PagedConfig, batch: int, width: int, sms: int) -> int:
    """Steps per program: ``cfg.steps`` halved while ``batch`` x programs per request < ``min_programs_per_sm``
    x ``sms`` (one request at 128K: 16 steps of 128 would be 64 programs on 132 SMs)."""
    steps = max(1, cfg.steps)
    while steps > 1 and batch * triton.cdiv(width, cfg.block_n * steps) < cfg.min_programs_per_sm * sms:
        steps //= 2
    return steps


def pad_heads(heads: int) -> int:
    """Heads padded for the dot's N side: a power of two, at least 16."""
    return max(16, triton.next_power_of_2(heads))


@triton.jit
def _head_sum(k, q, w, QPD: tl.constexpr, HP: tl.constexpr, IMPRECISE: tl.constexpr):
    """k ``[BN, 128]`` e4m3, q ``[QPD * HP, 128]`` e4m3, w ``[QPD * HP]`` fp32 -> ``[BN, QPD]`` fp32.

    ``IMPRECISE`` is the dot's ``max_num_imprecise_acc`` (None: Triton's SM90 default, no promotion of
    the fp8 MMA's reduced-precision accumulator over K = 128; 32: promoted after every wgmma)."""
    s = tl.dot(k, tl.trans(q), max_num_imprecise_acc=IMPRECISE, out_dtype=tl.float32)
    v = tl.maximum(s, 0.0) * w[None, :]
    if QPD == 1:  # no reshape: the row sum stays in the accumulator's layout
        return tl.sum(v, axis=1)[:, None]
    return tl.sum(tl.reshape(v, [k.shape[0], QPD, HP]), axis=2)


@triton.jit(do_not_specialize=["T", "S"])  # token and key counts vary every step: no recompiles
def _ragged_kernel(
    q_ptr, w_ptr, k_ptr, ks_ptr, ke_ptr, sc_ptr, out_ptr, T, S, H,
    HP: tl.constexpr, QPD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr, IMPRECISE: tl.constexpr,
):
    # Key blocks vary fastest: programs running together share their query rows (read from HBM about
    # once) and sweep the keys, which stay in L2.
    pid_m = tl.program_id(1)
    n0 = tl.program_id(0) * BLOCK_N
    keys = n0 + tl.arange(0, BLOCK_N)
    key_live = keys < S
    d = tl.arange(0, 128)
    # The block's widest window: a key tile outside it only needs -inf.
    rows_all = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ks_all = tl.load(ks_ptr + rows_all, mask=rows_all < T, other=2147483647)
    ke_all = tl.load(ke_ptr + rows_all, mask=rows_all < T, other=0)
    lo = tl.min(ks_all, axis=0)
    hi = tl.max(ke_all, axis=0)
    j = tl.arange(0, QPD * HP)
    jr = j // HP
    jh = j % HP
    sub = tl.arange(0, QPD)
    if (n0 < hi) & (n0 + BLOCK_N > lo):
        k = tl.load(k_ptr + keys.to(tl.int64)[:, None] * 128 + d[None, :], mask=key_live[:, None], other=0.0)
        scale = tl.load(sc_ptr + keys, mask=key_live, other=0.0)
        for g in tl.range(0, BLOCK_M // QPD, num_stages=NUM_STAGES):
            r0 = pid_m * BLOCK_M + g * QPD
            qrow = r0 + jr
            qlive = (qrow < T) & (jh < H)
            qoff = (qrow.to(tl.int64) * H + jh) * 128
            q = tl.load(q_ptr + qoff[:, None] + d[None, :], mask=qlive[:, None], other=0.0)
            w = tl.load(w_ptr + qrow.to(tl.int64) * H + jh, mask=qlive, other=0.0)
            logit = _head_sum(k, q, w, QPD, HP, IMPRECISE) * scale[:, None]  # [BLOCK_N, QPD]
            rows = r0 + sub
            ks = tl.load(ks_ptr + rows, mask=rows < T, other=0)
            ke = tl.load(ke_ptr + rows, mask=rows < T, other=0)
            inside = (keys[:, None] >= ks[None, :]) & (keys[:, None] < ke[None, :])
            logit = tl.where(inside, logit, float("-inf"))
            optr = out_ptr + rows.to(tl.int64)[None, :] * S + keys[:, None]
            tl.store(optr, logit, mask=key_live[:, None] & (rows < T)[None, :])
    else:
        ninf = tl.full([BLOCK_N, BLOCK_M], float("-inf"), tl.float32)
        optr = out_ptr + rows_all.to(tl.int64)[None, :] * S + keys[:, None]
        tl.store(optr, ninf, mask=key_live[:, None] & (rows_all < T)[None, :])


def logits_ragged(q8: Tensor, weights: Tensor, k8: Tensor, k_scale: Tensor, ks: Tensor, ke: Tensor,
                  config: RaggedConfig | None = None) -> Tensor:
    """q8 ``[T, H, 128]`` e4m3, weights ``[T, H]`` fp32, k8 ``[S, 128]`` e4m3, k_scale ``[S]`` fp32, ks/ke
    ``[T]`` int -> ``[T, S]`` fp32, ``-inf`` outside ``ks[t] <= s < ke[t]``."""
    cfg = config or RaggedConfig()
    t_total, heads = q8.shape[0], q8.shape[1]
    s_total = k8.shape[0]
    out = torch.empty(t_total, s_total, dtype=torch.float32, device=q8.device)
    if t_total == 0 or s_total == 0:
        return out
    for name in ("block_m", "block_n", "qpd"):
        v = getattr(cfg, name)
        if v < 1 or v & (v - 1) or (name == "block_n" and v < 16):
            raise ValueError(f"RaggedConfig.{name} must be a power of two (block_n >= 16), got {v}")
    hp = pad_heads(heads)
    qpd = max(1, min(cfg.qpd, 256 // hp, cfg.block_m))
    block_m = max(qpd, cfg.block_m // qpd * qpd)
    grid = (triton.cdiv(s_total, cfg.block_n), triton.cdiv(t_total, block_m))
    _ragged_kernel[grid](
        q8.contiguous(), weights.float().contiguous(), k8.contiguous(), ks.to(torch.int32).contiguous(),
        ke.to(torch.int32).contiguous(), k_scale.float().contiguous(), out, t_total, s_total, heads,
        HP=hp, QPD=qpd, BLOCK_M=block_m, BLOCK_N=cfg.block_n, NUM_STAGES=cfg.num_stages,
        IMPRECISE=cfg.imprecise_acc,
        num_warps=cfg.num_warps,
    )
    return out


@triton.jit(do_not_specialize=["STEPS"])  # chosen per batch and width: no recompiles
def _paged_kernel(
    q_ptr, w_ptr, kv_ptr, kvf_ptr, lens_ptr, table_ptr, out_ptr, H, P, max_pages, stride_table, W, STEPS,
    NQ: tl.constexpr, NQP: tl.constexpr, HP: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr, IMPRECISE: tl.constexpr,
):
    b = tl.program_id(1)  # position blocks vary fastest: neighbours share the request's queries
    length = tl.load(lens_ptr + b)
    d = tl.arange(0, 128)
    j = tl.arange(0, NQP * HP)
    jq = j // HP
    jh = j % HP
    qlive = (jq < NQ) & (jh < H)
    qoff = ((b * NQ + jq).to(tl.int64) * H + jh) * 128
    q = tl.load(q_ptr + qoff[:, None] + d[None, :], mask=qlive[:, None], other=0.0)
    w = tl.load(w_ptr + (b * NQ + jq).to(tl.int64) * H + jh, mask=qlive, other=0.0)
    qi = tl.arange(0, NQP)
    limit = length - NQ + 1 + qi  # [NQP]: query i sees p < limit[i]
    orow = (b * NQ + qi).to(tl.int64) * W
    page_bytes = P * 132
    base = tl.program_id(0) * (STEPS * BLOCK_N)
    if base < length:
        # Masked loads move no bytes past the context; the loop body has no branch (it pipelines).
        for st in tl.range(0, STEPS, num_stages=NUM_STAGES):
            pos = base + st * BLOCK_N + tl.arange(0, BLOCK_N)
            live = pos < length
            pidx = pos // P
            page = tl.load(table_ptr + b.to(tl.int64) * stride_table + pidx, mask=live & (pidx < max_pages), other=0)
            off = pos % P
            pbase = page.to(tl.int64) * page_bytes
            k = tl.load(kv_ptr + (pbase + off * 128)[:, None] + d[None, :], mask=live[:, None], other=0.0)
            scale = tl.load(kvf_ptr + (pbase + P * 128 + off * 4) // 4, mask=live, other=0.0)
            logit = _head_sum(k, q, w, NQP, HP, IMPRECISE) * scale[:, None]  # [BLOCK_N, NQP]
            logit = tl.where(pos[:, None] < limit[None, :], logit, float("-inf"))
            smask = (pos < W)[:, None] & (qi < NQ)[None, :]
            tl.store(out_ptr + orow[None, :] + pos[:, None], logit, mask=smask)
    else:  # past this request's context: only -inf
        for st in range(0, STEPS):
            pos = base + st * BLOCK_N + tl.arange(0, BLOCK_N)
            smask = (pos < W)[:, None] & (qi < NQ)[None, :]
            tl.store(out_ptr + orow[None, :] + pos[:, None], tl.full([BLOCK_N, NQP], float("-inf"), tl.float32),
                     mask=smask)


def logits_paged(q8: Tensor, weights: Tensor, index_cache: Tensor, context_lens: Tensor, block_table: Tensor,
                 max_context_len: int, config: PagedConfig | None = None) -> Tensor:
    """q8 ``[B, N, H, 128]`` e4m3, weights ``[B * N, H]`` fp32, index_cache ``[pages, P * 132]`` uint8,
    context_lens ``[B]`` int32, block_table ``[B, max_pages]`` int32 -> ``[B * N, max_context_len]`` fp32."""
    cfg = config or PagedConfig()
    batch, n_q, heads, _ = q8.shape
    width = max(int(max_context_len), 0)
    out = torch.empty(batch * n_q, width, dtype=torch.float32, device=q8.device)
    if batch == 0 or width == 0 or n_q == 0:
        return out
    page = index_cache.shape[1] // 132
    cache = index_cache if index_cache.is_contiguous() else index_cache.contiguous()
    table = block_table if block_table.dtype == torch.int32 else block_table.to(torch.int32)
    if table.stride(-1) != 1:
        table = table.contiguous()
    if cfg.block_n < 16 or cfg.block_n & (cfg.block_n - 1) or cfg.steps < 1:
        raise ValueError(f"PagedConfig.block_n must be a power of two >= 16 and steps >= 1, got {cfg}")
    nqp = triton.next_power_of_2(n_q)
    steps = paged_steps(cfg, batch, width, sm_count(q8.device))
    grid = (triton.cdiv(width, cfg.block_n * steps), batch)
    _paged_kernel[grid](
        q8.contiguous(), weights.float().contiguous(), cache.view(torch.float8_e4m3fn), cache.view(torch.float32),
        context_lens.to(torch.int32).contiguous(), table, out, heads, page, table.shape[1], table.stride(0), width,
        steps, NQ=n_q, NQP=nqp, HP=pad_heads(heads), BLOCK_N=cfg.block_n,
        NUM_STAGES=cfg.num_stages, IMPRECISE=cfg.imprecise_acc, num_warps=cfg.num_warps,
    )
    return out
