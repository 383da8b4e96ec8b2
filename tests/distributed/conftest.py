"""A tiny-v32 checkpoint on disk shared by the TP tests, and the single-process reference runner."""

from __future__ import annotations

import pytest
import torch

from dsa_runtime.distributed.sharding import is_mtp, shard_rule

PAGE = 16
NUM_PAGES = 32


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every test here runs on one torch thread (tests/conftest.py)."""


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from dsa_runtime.loader.make_checkpoint import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("tp") / "tiny-v32", preset="tiny-v32", seed=7)


@pytest.fixture(scope="module")
def checkpoint_entries(tiny_checkpoint):
    """``{name: (shape, bytes, is_fp8)}`` of the main stack, from the checkpoint's headers."""
    from dsa_runtime.loader.validate import inspect_layout

    layout = inspect_layout(tiny_checkpoint)
    return {name: (tuple(e.shape), e.nbytes, e.dtype == "F8_E4M3")
            for shard in layout.shards.values() for name, e in shard.entries.items()
            if not is_mtp(name, layout.config.num_hidden_layers)}


def expected_rank_bytes(entries, info) -> int:
    """Bytes a rank should hold: whole replicated tensors; its slice of split ones (an FP8 slice that does
    not start and end on a 128 block edge is dequantised to bf16: 2 bytes per element, no scales)."""
    from dsa_runtime.distributed.sharding import BLOCK, rank_range

    total = 0
    for name, (shape, nbytes, fp8) in entries.items():
        rule = shard_rule(name.removesuffix("_scale_inv"))
        if rule is None:
            total += nbytes
            continue
        if name.endswith("_scale_inv"):
            continue  # counted with its weight
        start, end = rank_range(rule, shape[rule.dim], info)
        elems = nbytes // (1 if fp8 else 2) * (end - start) // shape[rule.dim]
        aligned = start % BLOCK == 0 and (end % BLOCK == 0 or end == shape[rule.dim])
        if not fp8:
            total += elems * 2
        elif aligned:
            sshape, sbytes, _ = entries[f"{name}_scale_inv"]
            b0, b1 = start // BLOCK, -(-end // BLOCK)
            total += elems + sbytes * (b1 - b0) // sshape[rule.dim]
        else:
            total += elems * 2
    return total


def reference_runner(path, **kw):
    from dsa_runtime.cache import KVCache
    from dsa_runtime.loader import load_checkpoint
    from dsa_runtime.model.runner import ModelRunner, kernel_needs
    from dsa_runtime.resolve import KernelConfig, resolve_kernels

    ckpt = load_checkpoint(path, progress=False)
    kernels = resolve_kernels(KernelConfig(platform="cpu"), needs=kernel_needs(ckpt.config, PAGE))
    cache = KVCache(ckpt.config, NUM_PAGES, PAGE, "bf16", "cpu", torch.float32)
    return ModelRunner(ckpt.config, dict(ckpt.tensors), kernels=kernels, cache=cache, dtype=torch.float32, **kw)
