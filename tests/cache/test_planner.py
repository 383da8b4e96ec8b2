"""plan_capacity: token and byte budgets, the step workspaces (indexer logits of the biggest chunk) counted."""

from __future__ import annotations

import pytest
import torch

from dsa_runtime.cache import plan_capacity
from dsa_runtime.cache.planner import estimate_workspace
from dsa_runtime.loader.presets import preset_config
from dsa_runtime.model.config import ModelConfig


def _cfg(name: str) -> ModelConfig:
    return ModelConfig.from_hf(preset_config(name))


def test_token_budget_rounds_up_to_pages_plus_the_reserved_page():
    plan = plan_capacity(_cfg("tiny-v32"), 64, "fp8_656", max_total_tokens=1000)
    assert plan.num_pages == 16 + 1 and plan.max_total_tokens == 16 * 64
    assert plan.mla_bytes_per_token == 656 * 3 and plan.index_bytes_per_token == 132 * 3
    assert plan.bytes_per_token == 788 * 3 and plan.cache_bytes == 17 * 64 * 788 * 3


def test_byte_budget_subtracts_the_workspaces_first():
    cfg = _cfg("tiny-v32")
    kw = {"chunked_prefill_size": 512, "max_running": 8, "max_context": 4096, "dtype": torch.bfloat16}
    ws = sum(estimate_workspace(cfg, chunked_prefill_size=512, max_running=8, max_context=4096,
                                dtype=torch.bfloat16).values())
    per_page = 64 * (1152 + 132) * 3
    plan = plan_capacity(cfg, 64, "bf16", budget_bytes=ws + 10 * per_page + 5, **kw)
    assert plan.num_pages == 10 and plan.workspace_bytes == ws
    assert plan.workspace["indexer_prefill_logits"] == 512 * 4096 * 4  # chunk x context x fp32
    assert plan.workspace["indexer_decode_logits"] == 8 * 4096 * 4
    with pytest.raises(ValueError, match="not one KV page"):
        plan_capacity(cfg, 64, "bf16", budget_bytes=ws + per_page, **kw)


def test_dense_family_has_no_indexer_workspace_and_bigger_chunks_cost_more():
    v3 = plan_capacity(_cfg("tiny-v3"), 64, "bf16", max_total_tokens=64, max_context=4096)
    assert "indexer_prefill_logits" not in v3.workspace and v3.index_bytes_per_token == 0
    small = plan_capacity(_cfg("tiny-v32"), 64, "bf16", max_total_tokens=64, chunked_prefill_size=256)
    big = plan_capacity(_cfg("tiny-v32"), 64, "bf16", max_total_tokens=64, chunked_prefill_size=8192)
    assert big.workspace_bytes > small.workspace_bytes


def test_full_size_v32_numbers():
    """671B V3.2: 61 cached layers, 656 + 132 bytes per layer with FP8 KV; a 16k-token chunk over the
    163840-token context needs 10 GiB of indexer logits (the OOM users report)."""
    raw = preset_config("tiny-v32") | {
        "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128, "q_lora_rank": 1536,
        "qk_nope_head_dim": 128, "v_head_dim": 128, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "n_routed_experts": 256, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
        "index_n_heads": 64, "index_topk": 2048, "vocab_size": 129280, "max_position_embeddings": 163840,
    }
    cfg = ModelConfig.from_hf(raw)
    plan = plan_capacity(cfg, 64, "fp8_656", max_total_tokens=163840, chunked_prefill_size=16384)
    assert plan.bytes_per_token == (656 + 132) * 61
    assert plan.workspace["indexer_prefill_logits"] == 16384 * 163840 * 4 == 10 * 2**30


def test_bad_arguments():
    cfg = _cfg("tiny-v32")
    with pytest.raises(ValueError, match="exactly one"):
        plan_capacity(cfg, 64, "bf16")
    with pytest.raises(ValueError, match="exactly one"):
        plan_capacity(cfg, 64, "bf16", budget_bytes=1 << 30, max_total_tokens=10)
    with pytest.raises(ValueError, match="unknown KV layout"):
        plan_capacity(cfg, 64, "fp16", max_total_tokens=10)
    with pytest.raises(ValueError, match="max_total_tokens must be >= 1"):
        plan_capacity(cfg, 64, "bf16", max_total_tokens=0)


def test_device_budget_needs_a_gpu_and_a_sane_fraction():
    from dsa_runtime.cache import device_budget_bytes

    with pytest.raises(ValueError, match="needs a CUDA device"):
        device_budget_bytes("cpu", 0.85)
    with pytest.raises(ValueError, match="mem_fraction_static"):
        device_budget_bytes("cpu", 1.5)


def test_cuda_graphs_pool_is_set_aside_like_a_workspace():
    cfg = _cfg("tiny-v32")
    kw = {"chunked_prefill_size": 512, "max_running": 8, "max_context": 4096, "dtype": torch.bfloat16}
    plain = plan_capacity(cfg, 64, "bf16", budget_bytes=64 * 2**20, **kw)
    graphs = plan_capacity(cfg, 64, "bf16", budget_bytes=64 * 2**20, graph_max_bs=64, **kw)
    assert "cuda_graphs" not in plain.workspace
    pool = graphs.workspace["cuda_graphs"]
    # The largest bucket's rows: at least their indexer logits over the context and their output logits.
    assert pool >= 64 * (4096 * 4 + cfg.vocab_size * 4)
    assert graphs.workspace_bytes == plain.workspace_bytes + pool and graphs.num_pages < plain.num_pages
