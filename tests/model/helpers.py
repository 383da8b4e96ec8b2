"""Shared set-up of the model tests: tiny presets with fixed-seed random weights, runners, and sequence drivers.

Weights are generated once per (preset, fp8) and reused (read-only) by every test.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from dsa_runtime.cache import KVCache
from dsa_runtime.loader.presets import preset_config
from dsa_runtime.loader.random_init import random_state_dict
from dsa_runtime.model.config import ModelConfig
from dsa_runtime.model.runner import ModelRunner
from dsa_runtime.model.seqs import ForwardBatch, ForwardSeq, forward

PAGE_SIZE = 16
NUM_PAGES = 48


@functools.cache
def preset(name: str) -> ModelConfig:
    return ModelConfig.from_hf(preset_config(name))


@functools.cache
def weights(name: str) -> dict[str, torch.Tensor]:
    return random_state_dict(preset(name), seed=1234)


def kernels(kv_layout: str = "bf16", config: ModelConfig | None = None, page_size: int = PAGE_SIZE):
    """CPU kernels, checked against the model's needs (heads, k, page size...) when a config is given."""
    from dsa_runtime.model.runner import kernel_needs
    from dsa_runtime.resolve import KernelConfig, resolve_kernels

    needs = kernel_needs(config, page_size) if config is not None else None
    return resolve_kernels(KernelConfig(platform="cpu", kv_layout=kv_layout), needs=needs)


def make_runner(
    config: ModelConfig | str,
    tensors: dict[str, torch.Tensor] | None = None,
    *,
    kv_layout: str = "bf16",
    dtype: torch.dtype = torch.float32,
    mha_max_keys: int = 2048,
    num_pages: int = NUM_PAGES,
    page_size: int = PAGE_SIZE,
    poison: bool = True,
) -> ModelRunner:
    """A runner over a fresh cache; poisoned (0xFF = NaN bytes) so that reading an unwritten slot shows."""
    if isinstance(config, str):
        tensors = weights(config) if tensors is None else tensors
        config = preset(config)
    cache = KVCache(config, num_pages, page_size, kv_layout, "cpu", dtype)
    if poison:
        cache.poison()
    return ModelRunner(config, tensors, kernels=kernels(kv_layout, config, page_size), cache=cache, dtype=dtype,
                       mha_max_keys=mha_max_keys)


def tokens(n: int, seed: int, vocab: int = 1024) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def pages(first: int, n_tokens: int, page_size: int = PAGE_SIZE) -> list[int]:
    """A page table of consecutive pages from ``first`` (never page 0)."""
    return list(range(first, first + -(-n_tokens // page_size)))


def run_chunks(runner: ModelRunner, ids: list[int], table: list[int], chunk: int, start: int = 0) -> torch.Tensor:
    """Feed ``ids[start:]`` in chunks of ``chunk`` tokens (chunk 1 = decode steps); logits of every token."""
    out = []
    for p in range(start, len(ids), chunk):
        piece = ids[p:p + chunk]
        out.append(forward(runner, ForwardBatch([ForwardSeq(piece, p, table, "all")]))[0])
    return torch.cat(out)


def without_indexer(config: ModelConfig, tensors: dict[str, torch.Tensor]):
    """The same weights as a dense V3-style model: no index_* fields, no indexer tensors."""
    dense = dataclasses.replace(config, architecture="DeepseekV3ForCausalLM", index_n_heads=None,
                                index_head_dim=None, index_topk=None)
    return dense, {k: v for k, v in tensors.items() if ".indexer." not in k}


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def assert_logits_close(
    actual: torch.Tensor, expected: torch.Tensor, *, mean_tol: float, max_tol: float, spike: float,
    spike_frac: float, what: str,
) -> None:
    """Logits agree within kernel rounding noise, allowing a few discrete flips.

    The kernel contracts return bf16 (sparse attention, MoE), so two valid paths differ by bf16 rounding;
    the model's discrete choices (indexer top-k on FP8 keys, MoE expert choice) can flip at near-ties and
    move one position's logits by more. Hence: mean |diff| <= ``mean_tol``; at most ``spike_frac`` of
    positions exceed ``spike``; none exceeds ``max_tol``. A real bug (wrong slot, mask, rope position)
    moves most positions by O(1) and fails all three.
    """
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    assert torch.isfinite(actual).all(), f"{what}: non-finite logits"
    diff = (actual.float() - expected.float()).abs()
    per_pos = diff.reshape(-1, diff.shape[-1]).amax(dim=-1)
    mean = float(diff.mean())
    frac = float((per_pos > spike).float().mean())
    assert mean <= mean_tol, f"{what}: mean |diff| {mean:.5f} > {mean_tol}"
    assert frac <= spike_frac, f"{what}: {frac:.0%} of positions differ by > {spike} (allowed {spike_frac:.0%})"
    assert float(per_pos.max()) <= max_tol, f"{what}: max |diff| {float(per_pos.max()):.4f} > {max_tol}"


# Logits have scale ~4. fp32 model: bf16 kernel outputs give mean |diff| 0.002-0.015 (measured); injected
# bugs (decode rope position + 1, decode missing its own key) give 0.14-0.24, so 0.03 separates them.
FP32_TOL = {"mean_tol": 0.03, "max_tol": 1.5, "spike": 0.1, "spike_frac": 0.15}
# bf16 model: activations are bf16 too, so expert / top-k flips are common (measured mean 0.02-0.065).
BF16_TOL = {"mean_tol": 0.1, "max_tol": 4.0, "spike": 0.5, "spike_frac": 0.3}
