"""KVCache pools: shapes, dtypes and bytes per token for both MLA layouts, DSA and dense configs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dsa_runtime.cache import KVCache, mla_bytes_per_token
from dsa_runtime.loader.presets import preset_config
from dsa_runtime.model.config import ModelConfig


def _cfg(name: str) -> ModelConfig:
    return ModelConfig.from_hf(preset_config(name))


@pytest.mark.parametrize(("layout", "width", "dtype"), [("bf16", 576, torch.bfloat16), ("fp8_656", 656, torch.uint8)])
def test_pools_per_layer(layout, width, dtype):
    cfg = _cfg("tiny-v32")
    cache = KVCache(cfg, num_pages=5, page_size=64, kv_layout=layout)
    assert len(cache.mla) == cfg.num_hidden_layers == len(cache.index_k)  # main stack only, no MTP pool
    assert cache.mla[0].shape == (5, 64, width) and cache.mla[0].dtype == dtype
    assert cache.index_k[0].shape == (5, 64 * 132) and cache.index_k[0].dtype == torch.uint8
    assert cache.bytes_per_token == (mla_bytes_per_token(layout) + 132) * cfg.num_hidden_layers
    assert cache.total_bytes == cache.bytes_per_token * 5 * 64
    assert all(int(t.view(torch.uint8).max()) == 0 for t in cache.mla)  # zero-filled, never NaN garbage
    cache.poison()
    assert all(bool((t.view(torch.uint8) == 0xFF).all()) for t in (*cache.mla, *cache.index_k))


def test_dense_family_has_no_index_pool():
    cache = KVCache(_cfg("tiny-v3"), num_pages=3, page_size=16, kv_layout="fp8_656")
    assert cache.index_k == [] and cache.bytes_per_token == 656 * 3


def test_bad_arguments():
    cfg = _cfg("tiny-v32")
    with pytest.raises(ValueError, match="unknown KV layout"):
        KVCache(cfg, 4, 16, "fp8")
    with pytest.raises(ValueError, match="num_pages >= 2"):
        KVCache(cfg, 1, 16)
    with pytest.raises(ValueError, match="kv_lora_rank \\+ qk_rope_head_dim = 576"):
        KVCache(dataclasses.replace(cfg, kv_lora_rank=256), 4, 16)
