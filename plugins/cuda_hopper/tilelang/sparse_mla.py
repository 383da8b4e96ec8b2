"""Sparse MLA forward (absorbed / MQA form) as TileLang programs, built and compiled once per launch shape.

One thread block per (query row ``t``, group of 64 heads). The block keeps ``Q[t, heads, 0:576]`` in shared
memory and walks the row's ``K`` indices ``block_i`` at a time: it gathers those KV rows (latent part
``[block_i, 512]`` and rope part ``[block_i, 64]``) into shared memory, an index of ``-1`` (or ``>= S``)
giving a zero row that is never read from global memory (a predicated, zero-filling copy), computes
``S = Q . K^T`` with two wgmma GEMMs (latent + rope), runs the online softmax in fp32 and base 2 (``sm_scale *
log2(e)`` folded into one multiply; masked scores are ``-inf``) and accumulates ``O += P . V`` with ``V`` the
gathered latent tile itself (``P`` rounded to bf16). ``T.Pipelined`` overlaps the next chunk's gather with
this chunk's GEMMs.

At the end ``out = O / l`` in bf16 and ``lse = (log2(l) + m) * ln(2)`` (natural log); a head whose row had no
valid index (``l == 0``) gets zeros and ``+inf``.

Two schedules (:class:`TLConfig` ``variant``):

* ``"pipe"``: every thread does everything; TileLang's software pipeliner issues the gathers as cp.async.
* ``"ws"``: warp specialised (see :mod:`.sparse_mla_ws`): a producer warpgroup gathers with cp.async into a
  ring of stages guarded by mbarriers, two consumer warpgroups each own half of the 512 output columns;
* ``"wsa"``: ``ws`` whose score warpgroup also overlaps its softmax with its own ``P . V`` wgmma;
* ``"ws4"``: 512 threads (see :mod:`.sparse_mla_ws4`): a score warpgroup that only computes S and the softmax,
  two value warpgroups that own all of ``P . V``, and the ``ws`` gather;
* ``"wsf8"`` / ``"ws4f8"``: ``ws`` / ``ws4`` over the ``fp8_656`` cache (decode only; :data:`FP8_VARIANTS`):
  ``KV`` is ``[S, 656]`` e4m3 and the gather warpgroup dequantises each row into the bf16 stage
  (:mod:`.gather_fp8`).

Shapes: q ``[T, H, 576]`` bf16, kv ``[S, 576]`` bf16, indices ``[T, K]`` int32, out ``[T, H, 512]`` bf16,
lse ``[T, H]`` fp32; ``T`` and ``S`` are symbolic (one compile serves every batch), ``H`` and ``K`` are not.
"""

# No ``from __future__ import annotations``: TileLang evaluates the kernel's annotations, which name locals.
import functools
import math
from dataclasses import dataclass
from typing import Any

D_LATENT = 512
D_ROPE = 64
D_QK = D_LATENT + D_ROPE
HEAD_BLOCK = 64  # one wgmma M tile of heads per thread block
LOG2E = 1.4426950408889634
LN2 = math.log(2.0)
# Fast math (ex2.approx, no denormals) as in every flash-attention kernel; the pipeliner does the gathers.
PASS_CONFIGS = {"tl.enable_fast_math": True}


@dataclass(frozen=True)
class TLConfig:
    """Launch shape: gathered rows per step, pipeline stages, threads per block, schedule (``pipe`` / ``ws``)."""

    block_i: int = 64
    num_stages: int = 2
    threads: int = 256
    variant: str = "pipe"

    def label(self) -> str:
        return f"{self.variant}_i{self.block_i}_s{self.num_stages}_t{self.threads}"


PIPE_CONFIG = TLConfig()
# Defaults from the H200 run of bench/sparse_attn_tilelang.py (2026-11-23 06:24 UTC, every candidate PASS):
# prefill 4096 x 8K, 128 heads, k 2048: ws 4.37 ms = 78.5% of the same-run bf16 matmul (ws4 73.0%, wsa 71.1%,
# pipe 50.8%); bf16 decode batch 64 at 32K: ws4 112.8 us = 47.5% (ws 43.1%, pipe 37.0%).
DEFAULT_CONFIG = TLConfig(block_i=64, num_stages=2, threads=384, variant="ws")
DECODE_CONFIG = TLConfig(block_i=64, num_stages=2, threads=512, variant="ws4")
# Decode over the fp8_656 cache: a schedule whose gather warpgroup dequantises the rows (.gather_fp8). H200,
# 2026-11-23 08:20 UTC, 128 heads, k 2048, 32K, batch 64 (do_bench): wsf8c (the two head blocks of a row share
# the gather as a cluster, fp16 operands) 122.9 us, wsf8h (fp16 operands) 142.0 us, wsf8 (bf16) 148.8-149.1 us,
# Triton 206.8 us; bench/attention.py the same run: wsf8c 0.122 ms = 43% of the bf16 matmul. wsf8c pairs the two
# blocks of 128 heads; 64 heads (TP 2, or padded TP 8 ranks) run wsf8h. wsf8c's gather keeps a whole half
# chunk in flight with its indices read a chunk ahead and stores each converted piece into both CTAs
# (.gather_fp8.fp8_half_gather_macros), and its outputs leave by TMA: H200, 2026-11-27, batch 64 x 32K 95.9 us
# and batch 128 182.8 us, FlashMLA 100.9 / 189.9 in the same run (docs/benchmarks.md).
FP8_DECODE_CONFIG = TLConfig(block_i=64, num_stages=2, threads=384, variant="wsf8c")
FP8_DECODE_CONFIG_64 = TLConfig(block_i=64, num_stages=2, threads=384, variant="wsf8h")
# What bench/tilelang_compile.py compiles and bench/sparse_attn_tilelang.py times.
CANDIDATES = (
    PIPE_CONFIG,
    TLConfig(block_i=64, num_stages=1),
    TLConfig(block_i=32, num_stages=2),
    TLConfig(block_i=32, num_stages=3),
    DEFAULT_CONFIG,
    TLConfig(block_i=64, num_stages=2, threads=384, variant="wsa"),
    DECODE_CONFIG,
    TLConfig(block_i=64, num_stages=2, threads=512, variant="ws4f8"),
    TLConfig(block_i=64, num_stages=2, threads=384, variant="wsf8"),
    FP8_DECODE_CONFIG_64,
    FP8_DECODE_CONFIG,
)
# Threads each warp-specialised schedule runs (their block_i is 64).
WS_THREADS = {"ws": 384, "wsa": 384, "ws4": 512, "ws4f8": 512, "wsf8": 384, "wsf8h": 384, "wsf8c": 384}
# Schedules that read the ``fp8_656`` cache (decode only: prefill runs over the bf16 KV buffer).
FP8_VARIANTS = frozenset({"ws4f8", "wsf8", "wsf8h", "wsf8c"})


def check_shape(heads: int, k: int, cfg: TLConfig) -> None:
    """Raise ``ValueError`` for a shape the programs do not run (the backend's claims keep callers inside)."""
    if heads % HEAD_BLOCK:
        raise ValueError(f"tilelang sparse MLA runs head counts that are multiples of {HEAD_BLOCK}, got {heads}")
    if k < 1 or k % cfg.block_i:
        raise ValueError(f"tilelang sparse MLA needs k a positive multiple of block_i {cfg.block_i}, got {k}")
    if cfg.variant not in ("pipe", *WS_THREADS):
        raise ValueError(f"unknown tilelang sparse MLA variant {cfg.variant!r}; valid: pipe, {', '.join(WS_THREADS)}")
    if cfg.variant == "wsf8c" and heads != 2 * HEAD_BLOCK:
        raise ValueError(f"the wsf8c schedule pairs the two 64-head blocks of 128 heads, got {heads} heads")
    if cfg.variant != "pipe" and (cfg.threads != WS_THREADS[cfg.variant] or cfg.block_i != 64):
        raise ValueError(f"the {cfg.variant} schedule runs {WS_THREADS[cfg.variant]} threads and block_i 64, "
                         f"got {cfg.label()}")


def split_q_rows(T: Any, n_tok: Any, split: bool) -> Any:
    """The first dimension of q as a program declares it: its own symbol ``R`` when ``split`` (see
    :func:`program`), else the program's ``n_tok`` rows."""
    return T.dynamic("q_rows") if split else n_tok


def split_q_row(T: Any, tok: Any, q_rows: Any, split: bool) -> Any:
    """The q row of program row ``tok``: ``tok % R`` when ``split`` (truncated: ``tok >= 0``, ``R > 0``; the floor
    form adds sign fix-ups), else ``tok``, so an unsplit program's source does not change."""
    return T.truncmod(tok, q_rows) if split else tok


def pipe_program(heads: int, k: int, sm_scale: float, cfg: TLConfig, split: bool = False) -> Any:
    """The ``pipe`` schedule as a TileLang ``PrimFunc`` (imports tilelang); ``split``: see :func:`program`."""
    import tilelang.language as T

    from dsa_runtime.plugins.cuda_hopper.tilelang.chunk_steps import chunk_steps

    bi, d, dr = cfg.block_i, D_LATENT, D_ROPE
    n_chunks = -(-k // bi)
    scale2 = sm_scale * LOG2E
    hb = HEAD_BLOCK
    n_tok = T.dynamic("n_tok")
    n_kv = T.dynamic("n_kv")
    bf16, f32 = "bfloat16", "float32"
    out_t = f32 if split else bf16
    softmax, lse, _, _ = chunk_steps(hb, bi, scale2, n_kv, split)
    q_rows = split_q_rows(T, n_tok, split)

    @T.prim_func
    def sparse_mla_pipe(
        Q: T.Tensor((q_rows, heads, D_QK), bf16),
        KV: T.Tensor((n_kv, D_QK), bf16),
        Idx: T.Tensor((n_tok, k), "int32"),
        Out: T.Tensor((n_tok, heads, d), out_t),
        Lse: T.Tensor((n_tok, heads), f32),
    ):
        with T.Kernel(n_tok, heads // hb, threads=cfg.threads) as (tok, hblk):
            q_lat = T.alloc_shared((hb, d), bf16)
            q_rope = T.alloc_shared((hb, dr), bf16)
            kv_lat = T.alloc_shared((bi, d), bf16)
            kv_rope = T.alloc_shared((bi, dr), bf16)
            p_sh = T.alloc_shared((hb, bi), bf16)
            valid = T.alloc_fragment((bi,), "bool")
            acc_o = T.alloc_fragment((hb, d), f32)
            acc_s = T.alloc_fragment((hb, bi), f32)
            m_i = T.alloc_fragment((hb,), f32)
            m_prev = T.alloc_fragment((hb,), f32)
            l_i = T.alloc_fragment((hb,), f32)
            l_blk = T.alloc_fragment((hb,), f32)
            alpha = T.alloc_fragment((hb,), f32)

            h0 = hblk * hb
            q_tok = split_q_row(T, tok, q_rows, split)
            T.copy(Q[q_tok, h0 : h0 + hb, 0:d], q_lat)
            T.copy(Q[q_tok, h0 : h0 + hb, d:D_QK], q_rope)
            T.fill(acc_o, 0)
            T.fill(l_i, 0)
            # A finite floor instead of -inf keeps (m_prev - m) finite while every score so far was masked.
            T.fill(m_i, -(2.0**30))

            for c in T.Pipelined(n_chunks, num_stages=cfg.num_stages):
                for j in T.Parallel(bi):
                    valid[j] = (Idx[tok, c * bi + j] >= 0) and (Idx[tok, c * bi + j] < n_kv)
                # Plain gathers on purpose: TileLang's safe-memory-access pass predicates each row on
                # 0 <= index < n_kv and emits a zero-filling cp.async (src-size 0: nothing is read), which the
                # pipeliner then double-buffers; an explicit if_then_else here would defeat cp.async.
                # bench/tilelang_compile.py checks the predicate is in the generated source.
                for j, e in T.Parallel(bi, d):
                    kv_lat[j, e] = KV[Idx[tok, c * bi + j], e]
                for j, e in T.Parallel(bi, dr):
                    kv_rope[j, e] = KV[Idx[tok, c * bi + j], d + e]
                for h, j in T.Parallel(hb, bi):
                    acc_s[h, j] = T.if_then_else(valid[j], 0, -T.infinity(f32))
                T.gemm(q_lat, kv_lat, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.gemm(q_rope, kv_rope, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                softmax(acc_s, m_i, m_prev, l_i, l_blk, alpha)
                for h, e in T.Parallel(hb, d):
                    acc_o[h, e] *= alpha[h]
                T.copy(acc_s, p_sh)
                T.gemm(p_sh, kv_lat, acc_o, policy=T.GemmWarpPolicy.FullRow)

            for h, e in T.Parallel(hb, d):
                acc_o[h, e] = T.if_then_else(l_i[h] > 0, acc_o[h, e] / l_i[h], 0)
            lse(l_blk, l_i, m_i)
            T.copy(acc_o, Out[tok, h0 : h0 + hb, :])
            T.copy(l_blk, Lse[tok, h0 : h0 + hb])

    return sparse_mla_pipe


def program(heads: int, k: int, sm_scale: float, cfg: TLConfig, split: bool = False) -> Any:
    """The TileLang ``PrimFunc`` of ``cfg``'s schedule for this shape (checked first).

    ``split``: the program writes fp32 outputs and ``lse = -inf`` for an empty row (a split-K partial, merged
    by :func:`..triton.sparse_mla_combine.combine_splits`) instead of bf16 and ``+inf``. It then reads q in place:
    q ``[R, H, 576]`` for index and output rows ``[n * R, ...]``, row ``t`` using q row ``t % R`` (split ``s`` of
    query row ``r`` is row ``s * R + r``): no copy of q per split (:func:`split_q_row`)."""
    check_shape(heads, k, cfg)
    if cfg.variant in ("ws4", "ws4f8"):
        from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla_ws4 import ws4_program

        return ws4_program(heads, k, sm_scale, cfg, split, fp8=cfg.variant in FP8_VARIANTS)
    if cfg.variant != "pipe":
        from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla_ws import ws_program

        return ws_program(heads, k, sm_scale, cfg, split)
    return pipe_program(heads, k, sm_scale, cfg, split)


def cuda_source(heads: int, k: int, sm_scale: float, cfg: TLConfig, split: bool = False,
                arch: str = "sm_90a") -> tuple[str, int]:
    """CUDA source of the program lowered for ``arch`` without a GPU, and its dynamic shared memory in bytes."""
    import re

    import tilelang
    from tvm.target import Target

    target = Target({"kind": "cuda", "arch": arch})
    with tilelang.transform.PassContext(config=PASS_CONFIGS), target:
        art = tilelang.lower(program(heads, k, sm_scale, cfg, split), target=target)
    found = re.search(r'"dyn_shared_memory_buf":\s*(\d+)', art.device_mod.script())
    return art.kernel_source, int(found.group(1)) if found else 0


def source_problems(src: str) -> list[str]:
    """What the generated CUDA source must contain for the kernel to be right and fast (empty when all is)."""
    import re

    out = []
    if "wgmma" not in src:
        out.append("no wgmma GEMM")
    fp8 = re.search(r"const fp8_e4_t\* __restrict__ (\w+)", src)
    if fp8:  # the fp8_656 gathers load rows into registers: each load must sit under the index check
        from dsa_runtime.plugins.cuda_hopper.tilelang.cluster_push import cluster_problems
        from dsa_runtime.plugins.cuda_hopper.tilelang.setmaxnreg_check import setmaxnreg_problems

        return out + fp8_gather_problems(src, fp8.group(1)) + setmaxnreg_problems(src) + cluster_problems(src)
    gathers = re.findall(r"cp_async_gs(?:_conditional)?<16>\([^;]*KV\[[^;]*;", src)
    if not gathers:
        out.append("KV rows are not gathered with cp.async")
    # The pipe schedule's predicate reads the index in place; the ws one names it (bool ok = 0 <= row < n_kv).
    named = re.search(r"bool ok = \(\(0 <= row\) && \(row < n_kv\)\);", src) is not None
    for g in gathers:
        guarded = "< n_kv" in g and ("0 <= Idx" in g or (named and "(ok &&" in g))
        if "cp_async_gs_conditional" not in g or not guarded:
            out.append("a KV gather is not predicated on 0 <= index < n_kv (a -1 would be read)")
            break
    from dsa_runtime.plugins.cuda_hopper.tilelang.setmaxnreg_check import setmaxnreg_problems

    return out + setmaxnreg_problems(src)


def fp8_gather_problems(src: str, kv: str) -> list[str]:
    """What is wrong with the ``fp8_656`` gathers of ``src`` (whose cache parameter is named ``kv``): every read
    of the cache must sit inside ``if ((0 <= row) && (row < n_kv)) {`` (so a ``-1`` is never read)."""
    import re

    guard = "if ((0 <= row) && (row < n_kv)) {"
    read = re.compile(rf"\b{kv}\b")
    stack = [False]  # per open brace: inside the guard?
    reads = 0
    for raw in src.splitlines():
        line = raw.strip()
        if "__restrict__" in line:
            continue  # the declaration
        if read.search(line):
            reads += 1
            if not stack[-1]:
                return [f"an fp8_656 cache read outside the index check: {line[:120]}"]
        if line == "} else {":
            stack.pop()
            stack.append(stack[-1] if stack else False)
            continue
        for _ in range(line.count("}")):
            if len(stack) > 1:
                stack.pop()
        for _ in range(line.count("{")):
            stack.append(stack[-1] or line == guard)
    return [] if reads else ["the fp8_656 cache is never read"]


@functools.lru_cache(maxsize=64)
def compiled(heads: int, k: int, sm_scale: float, cfg: TLConfig, split: bool = False, target: str = "cuda") -> Any:
    """The compiled kernel (a ``tilelang`` JIT kernel called as ``kern(q, kv, idx, out, lse)``), cached per
    (heads, k, sm_scale, config, split, target): ``T`` and ``S`` are symbolic, so batch sizes share one compile."""
    import tilelang

    return tilelang.compile(program(heads, k, sm_scale, cfg, split), target=target, pass_configs=PASS_CONFIGS)


def precompile(keys: list[tuple[int, int, float, TLConfig, bool]], workers: int = 8) -> dict[tuple, str]:
    """Compile the kernels of ``keys`` (``(heads, k, sm_scale, config, split)``) in parallel threads (TileLang's
    lowering releases the GIL and nvcc is a subprocess); returns the error of each key that failed."""
    from concurrent.futures import ThreadPoolExecutor

    unique = list(dict.fromkeys(keys))
    errors: dict[tuple, str] = {}

    def one(key: tuple) -> None:
        try:
            compiled(*key)
        except Exception as exc:  # noqa: BLE001 - reported per key; the caller decides
            errors[key] = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:300]

    with ThreadPoolExecutor(max(1, min(workers, len(unique)))) as pool:
        list(pool.map(one, unique))
    return errors


def flops(tokens: int, heads: int, k: int) -> int:
    """``2 * H * (576 + 512) * K`` per query row: the two GEMMs (scores and ``P @ V``)."""
    return 2 * tokens * heads * (D_QK + D_LATENT) * k
