"""random_state_dict: exact layout, determinism, FP8 quantization and O(1) activations."""

from __future__ import annotations

import pytest
import torch

from dsa_runtime.loader.presets import preset_config
from dsa_runtime.loader.random_init import random_state_dict
from dsa_runtime.loader.spec import expected_tensors
from dsa_runtime.model.config import ModelConfig
from dsa_runtime.reference.fp8 import block_dequant_weight

DTYPES = {"fp8": torch.float8_e4m3fn, "fp32": torch.float32, "bf16": torch.bfloat16, "norm": torch.bfloat16}


@pytest.fixture(scope="module")
def v32():
    cfg = ModelConfig.from_hf(preset_config("tiny-v32"))
    return cfg, random_state_dict(cfg, seed=0)


def test_layout_matches_expected_tensors(v32):
    cfg, sd = v32
    specs = expected_tensors(cfg)
    assert list(sd) == list(specs)
    for name, spec in specs.items():
        assert tuple(sd[name].shape) == spec.shape, name
        assert sd[name].dtype == DTYPES[spec.kind], name


def test_other_seed_differs(v32):
    # same seed -> same bytes is checked on the written files (test_make_checkpoint)
    cfg, sd = v32
    other = random_state_dict(cfg, seed=1)
    for name in ("model.layers.1.self_attn.kv_b_proj.weight", "model.embed_tokens.weight"):
        assert not torch.equal(sd[name].float(), other[name].float()), name


def test_ue8m0_scales_are_powers_of_two(v32):
    _, sd = v32
    for name, t in sd.items():
        if name.endswith("_scale_inv"):
            assert torch.equal(torch.exp2(torch.log2(t).round()), t), name


def test_v3_float_scales_and_unquantized_variant():
    cfg = ModelConfig.from_hf(preset_config("tiny-v3"))
    sd = random_state_dict(cfg, seed=3)
    scales = torch.cat([t.flatten() for n, t in sd.items() if n.endswith("_scale_inv")])
    assert not torch.equal(torch.exp2(torch.log2(scales).round()), scales)  # plain amax/448
    plain = random_state_dict(cfg, seed=3, fp8=False)
    assert not any(n.endswith("_scale_inv") for n in plain)
    assert plain["model.layers.1.mlp.experts.7.down_proj.weight"].dtype == torch.bfloat16


def test_scaled_for_unit_activations(v32):
    cfg, sd = v32
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(64, cfg.hidden_size, generator=gen)
    for lin in ("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa", "mlp.gate_proj"):
        n = f"model.layers.0.{lin}.weight"
        w = block_dequant_weight(sd[n], sd[f"{n}_scale_inv"])
        assert 0.8 < (x @ w.T).std().item() < 1.2, lin
    emb = sd["model.embed_tokens.weight"].float()
    assert 0.9 < emb.std().item() < 1.1
    norm = sd["model.layers.1.input_layernorm.weight"].float()
    assert (norm - 1).abs().max().item() < 0.2 and norm.std().item() > 0
    bias = sd["model.layers.1.mlp.gate.e_score_correction_bias"]
    assert bias.dtype == torch.float32 and 0 < bias.abs().max().item() < 0.1
