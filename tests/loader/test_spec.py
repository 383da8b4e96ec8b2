"""expected_tensors: the released checkpoints' tensor inventory, shapes and kinds."""

from __future__ import annotations

import pytest

from dsa_runtime.loader.presets import preset_config
from dsa_runtime.loader.spec import expected_tensors, is_mtp_tensor, parameter_count
from dsa_runtime.model.config import ModelConfig
from tests.loader.real_configs import v3_671b, v32_671b


def test_v3_671b_inventory_matches_the_published_checkpoint():
    cfg = ModelConfig.from_hf(v3_671b())
    specs = expected_tensors(cfg)
    # 91,991 tensors and 684.5B parameters (671B main stack + 13.5B MTP) in the published DeepSeek-V3.
    assert len(specs) == 91991
    assert parameter_count(specs) == 684_489_845_504
    main = {n: s for n, s in specs.items() if not is_mtp_tensor(n, cfg)}
    assert parameter_count(main) == 671_026_419_200
    a = "model.layers.0.self_attn"
    assert specs[f"{a}.kv_a_proj_with_mqa.weight"].shape == (576, 7168)
    assert specs[f"{a}.kv_a_proj_with_mqa.weight_scale_inv"].shape == (5, 56)  # partial edge block
    assert specs[f"{a}.q_b_proj.weight_scale_inv"].shape == (192, 12)
    assert specs[f"{a}.o_proj.weight_scale_inv"].shape == (56, 128)
    assert specs["model.layers.0.mlp.down_proj.weight_scale_inv"].shape == (56, 144)
    assert specs["model.layers.3.mlp.experts.255.up_proj.weight"].shape == (2048, 7168)
    assert specs["model.layers.3.mlp.gate.e_score_correction_bias"].kind == "fp32"
    assert specs["model.layers.3.mlp.gate.weight"].kind == "bf16"
    assert specs["model.layers.61.eh_proj.weight"].shape == (7168, 14336)
    assert specs["model.layers.61.eh_proj.weight"].kind == "bf16"
    assert specs["model.layers.61.shared_head.head.weight"].shape == (129280, 7168)
    assert "model.layers.62.input_layernorm.weight" not in specs
    assert not any("indexer" in n for n in specs)


def test_v32_adds_seven_indexer_tensors_per_layer_including_mtp():
    cfg = ModelConfig.from_hf(v32_671b())
    specs = expected_tensors(cfg)
    assert len(specs) == 91991 + 7 * 62
    ix = "model.layers.61.self_attn.indexer"
    assert specs[f"{ix}.wq_b.weight"].shape == (64 * 128, 1536)
    assert specs[f"{ix}.wq_b.weight_scale_inv"].shape == (64, 12)
    assert specs[f"{ix}.wk.weight"].shape == (128, 7168)
    assert specs[f"{ix}.k_norm.bias"].kind == "norm"
    assert specs[f"{ix}.weights_proj.weight"].shape == (64, 7168)
    assert specs[f"{ix}.weights_proj.weight"].kind == "bf16"


def test_unquantized_layout_has_no_scales():
    raw = v3_671b()
    del raw["quantization_config"]
    specs = expected_tensors(ModelConfig.from_hf(raw))
    assert not any(n.endswith("_scale_inv") for n in specs)
    assert {s.kind for s in specs.values()} == {"bf16", "fp32", "norm"}
    quantized = expected_tensors(ModelConfig.from_hf(v3_671b()))
    assert set(specs) == {n for n in quantized if not n.endswith("_scale_inv")}
    assert specs["model.layers.0.mlp.up_proj.weight"].kind == "bf16"


def test_q_proj_without_q_lora():
    raw = v3_671b()
    raw["q_lora_rank"] = None
    specs = expected_tensors(ModelConfig.from_hf(raw))
    assert specs["model.layers.0.self_attn.q_proj.weight"].shape == (128 * 192, 7168)
    assert "model.layers.0.self_attn.q_a_proj.weight" not in specs


@pytest.mark.parametrize(
    ("name", "mtp"),
    [
        ("model.layers.3.self_attn.o_proj.weight", True),
        ("model.layers.2.self_attn.o_proj.weight", False),
        ("model.layers.30.mlp.gate.weight", True),
        ("model.embed_tokens.weight", False),
        ("lm_head.weight", False),
    ],
)
def test_is_mtp_tensor(name, mtp):
    cfg = ModelConfig.from_hf(preset_config("tiny-v32"))  # 3 layers: MTP is layer 3
    assert is_mtp_tensor(name, cfg) is mtp


def test_tiny_preset_every_fp8_weight_has_a_scale():
    specs = expected_tensors(ModelConfig.from_hf(preset_config("tiny-v32")))
    fp8 = [n for n, s in specs.items() if s.kind == "fp8"]
    assert fp8 and all(f"{n}_scale_inv" in specs for n in fp8)
    assert all(n[: -len("_scale_inv")] in specs for n in specs if n.endswith("_scale_inv"))
    assert specs["model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv"].shape == (5, 2)
