"""Inputs, FLOP/byte counts and the subjects of ``bench/attention.py`` (sparse MLA prefill, decode, KV store).

Subjects are bound through resolution (``methods={method: backend}``), so a backend runs exactly as the engine
would call it, head / k padding included; FlagGems (pip ``flag-gems`` 5.0.2) is wrapped here: its
``flag_gems.fused.flash_mla_sparse_fwd`` mirrors FlashMLA's prefill API (q ``[s_q, h_q, 576]``, kv
``[s_kv, 1, 576]``, indices ``[s_q, 1, K]``, 64 or 128 heads) and serves bf16 decode over the flattened cache.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch

from dsa_runtime.capabilities import MethodClaim, ValueSet
from dsa_runtime.errors import ConfigError
from dsa_runtime.padding import PaddedSparseAttn
from dsa_runtime.resolve import KernelConfig, resolve_kernels

D_QK, D_V, PAGE, SM_SCALE = 576, 512, 64, 0.135234
POOL_ROWS = 8 << 20  # cache rows built per context (9.7 GB bf16): larger batch x context share this pool


def flops(queries: int, heads: int, k: int) -> float:
    """Sparse MLA FLOPs, FlashMLA's convention: 2 * h * (576 + 512) * k per query token."""
    return 2.0 * queries * heads * (D_QK + D_V) * k


def decode_bytes(batch: int, heads: int, k: int, layout: str) -> float:
    """Bytes a decode step must move: the selected rows, q, out (bf16), lse and the indices."""
    row = 2 * D_QK if layout == "bf16" else 656
    return batch * (k * row + heads * (2 * D_QK + 2 * D_V + 4) + 4 * k)


def bound(backend: str, method: str, layout: str, needs: dict) -> tuple[Callable | None, str]:
    """``method`` of ``backend`` as resolution binds it, or (None, why not)."""
    logging.getLogger("dsa_runtime").setLevel(logging.WARNING)
    try:
        resolved = resolve_kernels(KernelConfig(kv_layout=layout, methods={method: backend}), needs=needs)
    except (ConfigError, KeyError) as exc:
        return None, str(exc).split("; backends that can")[0]
    family, name = method.split(".")
    return getattr(getattr(resolved, family), name), resolved.choices[method].reason


def flaggems() -> tuple[dict[str, Callable], str]:
    """FlagGems' sparse prefill as our ``prefill`` / bf16 ``decode`` (heads padded to 64/128), or why not."""
    try:
        from flag_gems.fused import flash_mla_sparse_fwd
    except Exception as exc:  # noqa: BLE001 - any import failure means: not available in this run
        return {}, f"flag_gems not importable: {type(exc).__name__}: {exc}"

    def prefill(q, kv, indices, sm_scale, d_v=512):
        out, _, lse = flash_mla_sparse_fwd(q.contiguous(), kv.unsqueeze(1), indices.unsqueeze(1).contiguous(),
                                           sm_scale, d_v)
        return out, lse

    def decode(q, kv_cache, indices, sm_scale, *, layout, d_v=512):
        b, n_q, h, _ = q.shape
        out, lse = prefill(q.reshape(b * n_q, h, D_QK), kv_cache.reshape(-1, D_QK), indices.reshape(b * n_q, -1),
                           sm_scale, d_v)
        return out.reshape(b, n_q, h, d_v), lse.reshape(b, n_q, h)

    claim = MethodClaim(heads=ValueSet.one_of(64, 128), k=ValueSet.multiples(16, 16, 1 << 20))
    return {
        "prefill": PaddedSparseAttn(prefill, "sparse_attn.prefill", claim),
        "decode": PaddedSparseAttn(decode, "sparse_attn.decode", claim),
    }, "flag_gems.fused.flash_mla_sparse_fwd (heads padded to 64/128)"


def prefill_inputs(tokens: int, n_kv: int, heads: int, k: int, gen: torch.Generator) -> dict:
    """Random q / kv; per query k random rows (duplicates allowed by the contract), ~1% of them -1."""
    dev = "cuda"
    q = torch.randn(tokens, heads, D_QK, device=dev, generator=gen, dtype=torch.bfloat16)
    kv = torch.randn(n_kv, D_QK, device=dev, generator=gen, dtype=torch.bfloat16)
    idx = torch.randint(0, n_kv, (tokens, k), device=dev, generator=gen, dtype=torch.int32)
    idx = torch.where(torch.rand(tokens, k, device=dev, generator=gen) < 0.01, -1, idx)
    return {"q": q, "kv": kv, "indices": idx}


def cache_pool(context: int, layout: str, gen: torch.Generator) -> torch.Tensor:
    """A ``[pages, 64, W]`` cache of ``min(128 * context, POOL_ROWS)`` rows (whole contexts), random rows.

    ``fp8_656`` rows: e4m3 ``c``, four power-of-two scales (what our cache stores), bf16 ``k_pe``.
    """
    rows = max(1, min(128, POOL_ROWS // context)) * context
    if layout == "bf16":
        return torch.randn(rows // PAGE, PAGE, D_QK, device="cuda", generator=gen, dtype=torch.bfloat16)
    return fp8_cache(rows, gen)


def fp8_cache(rows: int, gen: torch.Generator) -> torch.Tensor:
    """``[rows / 64, 64, 656]`` random ``fp8_656`` rows on CUDA: e4m3 latent, four power-of-two scales (what our
    cache stores), bf16 rope part."""
    dev = "cuda"
    c8 = torch.randn(rows, 512, device=dev, generator=gen, dtype=torch.bfloat16).mul_(64).to(torch.float8_e4m3fn)
    scales = torch.exp2(torch.randint(-10, -4, (rows, 4), device=dev, generator=gen).float())
    k_pe = torch.randn(rows, 64, device=dev, generator=gen, dtype=torch.bfloat16)
    row = torch.cat([c8.view(torch.uint8), scales.view(torch.uint8), k_pe.view(torch.uint8)], dim=1)
    return row.reshape(rows // PAGE, PAGE, 656)


def decode_inputs(cache: torch.Tensor, context: int, batch: int, heads: int, k: int, gen: torch.Generator) -> dict:
    """Request r selects k random slots of its own context (wrapping around the pool), ~1% -1."""
    dev = "cuda"
    rows = cache.shape[0] * PAGE
    base = (torch.arange(batch, device=dev) * context) % rows
    idx = base[:, None] + torch.randint(0, context, (batch, k), device=dev, generator=gen)
    idx = torch.where(torch.rand(batch, k, device=dev, generator=gen) < 0.01, -1, idx).to(torch.int32)
    q = torch.randn(batch, 1, heads, D_QK, device=dev, generator=gen, dtype=torch.bfloat16)
    return {"q": q, "cache": cache, "indices": idx[:, None, :]}


def store_inputs(n: int, layout: str, gen: torch.Generator) -> dict:
    """``n`` new rows to store at distinct random slots of a 4x larger cache (one -1)."""
    dev, width = "cuda", (D_QK if layout == "bf16" else 656)
    pages = math.ceil(4 * n / PAGE)
    dtype = torch.bfloat16 if layout == "bf16" else torch.uint8
    cache = torch.zeros(pages, PAGE, width, device=dev, dtype=dtype)
    slots = torch.randperm(pages * PAGE, device=dev, generator=gen)[:n]
    slots[0] = -1
    c = torch.randn(n, 512, device=dev, generator=gen, dtype=torch.bfloat16)
    k_pe = torch.randn(n, 64, device=dev, generator=gen, dtype=torch.bfloat16)
    return {"cache": cache, "slots": slots, "c": c, "k_pe": k_pe}


def store_bytes(n: int, layout: str) -> float:
    return n * (2 * D_QK + (2 * D_QK if layout == "bf16" else 656) + 8)
