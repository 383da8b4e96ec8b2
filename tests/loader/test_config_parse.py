"""parse_hf_config: the real 671B configs, the tiny presets, and one clear error per bad field."""

from __future__ import annotations

import math

import pytest

from dsa_runtime.errors import ConfigError
from dsa_runtime.loader.presets import preset_config
from dsa_runtime.model.config import ModelConfig
from dsa_runtime.model.config_parse import parse_hf_config
from tests.loader.real_configs import v3_671b, v32_671b


def test_real_v32_config_values():
    cfg = ModelConfig.from_hf(v32_671b())
    assert cfg.architecture == "DeepseekV32ForCausalLM"
    assert cfg.is_dsa
    assert (cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk) == (64, 128, 2048)
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.moe_intermediate_size) == (
        129280, 7168, 18432, 2048)
    assert (cfg.num_hidden_layers, cfg.first_k_dense_replace, cfg.num_attention_heads) == (61, 3, 128)
    assert (cfg.q_lora_rank, cfg.kv_lora_rank) == (1536, 512)
    assert (cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.qk_head_dim) == (128, 64, 128, 192)
    assert (cfg.n_routed_experts, cfg.n_shared_experts, cfg.num_experts_per_tok) == (256, 1, 8)
    assert (cfg.n_group, cfg.topk_group, cfg.routed_scaling_factor) == (8, 4, 2.5)
    assert cfg.rope_scaling is not None
    rs = cfg.rope_scaling
    assert (rs.factor, rs.original_max_position_embeddings, rs.beta_fast, rs.beta_slow) == (40, 4096, 32, 1)
    assert cfg.max_position_embeddings == 163840
    assert cfg.num_nextn_predict_layers == 1
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.tie_word_embeddings) == (0, 1, False)
    assert cfg.quantization is not None and cfg.scale_fmt == "ue8m0"
    assert cfg.quantization.weight_block_size == (128, 128)
    assert math.isclose(cfg.softmax_scale, 0.135234, rel_tol=1e-5)
    assert cfg.is_moe_layer(3) and not cfg.is_moe_layer(2)
    # keys the parser does not model are kept, not dropped
    assert cfg.extra["torch_dtype"] == "bfloat16"


def test_real_v3_config_is_dense_attention_with_float_scales():
    cfg = parse_hf_config(v3_671b())
    assert cfg.architecture == "DeepseekV3ForCausalLM"
    assert not cfg.is_dsa and cfg.index_topk is None and cfg.index_n_heads is None
    assert cfg.scale_fmt == "float"
    assert math.isclose(cfg.softmax_scale, 0.135234, rel_tol=1e-5)


def test_rope_type_key_and_v31_scale_fmt():
    raw = v3_671b()
    rs = raw["rope_scaling"]
    rs["rope_type"] = rs.pop("type")
    raw["quantization_config"]["scale_fmt"] = "ue8m0"  # V3.1
    cfg = parse_hf_config(raw)
    assert cfg.rope_scaling is not None and cfg.rope_scaling.factor == 40
    assert cfg.scale_fmt == "ue8m0" and not cfg.is_dsa


def test_unquantized_and_no_rope_scaling_and_no_q_lora():
    raw = v3_671b()
    del raw["quantization_config"], raw["rope_scaling"]
    raw["q_lora_rank"] = None  # V2-Lite style q_proj
    cfg = parse_hf_config(raw)
    assert cfg.quantization is None and cfg.rope_scaling is None and cfg.q_lora_rank is None
    assert math.isclose(cfg.softmax_scale, 192**-0.5)


@pytest.mark.parametrize("name", ["tiny-v32", "tiny-v3"])
def test_presets_parse_with_real_kernel_widths(name):
    cfg = parse_hf_config(preset_config(name))
    assert (cfg.kv_lora_rank, cfg.qk_rope_head_dim) == (512, 64)
    assert cfg.num_nextn_predict_layers == 1
    assert [cfg.is_moe_layer(layer) for layer in range(cfg.num_hidden_layers)] == [False, True, True]
    if name == "tiny-v32":
        assert cfg.is_dsa and cfg.index_head_dim == 128 and cfg.scale_fmt == "ue8m0"
        assert cfg.index_topk is not None and cfg.index_topk * 16 <= cfg.max_position_embeddings
    else:
        assert not cfg.is_dsa and cfg.scale_fmt == "float"


def test_tiny_chat_preset_is_v32_with_sparsity_well_below_the_training_context():
    cfg = parse_hf_config(preset_config("tiny-chat"))
    assert (cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.index_head_dim) == (512, 64, 128)
    assert cfg.is_dsa and cfg.scale_fmt == "ue8m0" and cfg.num_nextn_predict_layers == 1
    assert [cfg.is_moe_layer(layer) for layer in range(cfg.num_hidden_layers)] == [False] + [True] * 4
    assert cfg.index_topk * 8 <= 1024  # the training context (train/train_tiny.py --ctx)


def test_preset_config_is_a_fresh_copy_and_unknown_name_fails():
    a = preset_config("tiny-v32")
    a["rope_scaling"]["factor"] = 99
    assert preset_config("tiny-v32")["rope_scaling"]["factor"] == 4
    with pytest.raises(ConfigError, match="tiny-v4"):
        preset_config("tiny-v4")


@pytest.mark.parametrize("missing", ["index_n_heads", "index_head_dim", "index_topk"])
def test_partial_index_keys_name_the_missing_one(missing):
    raw = v32_671b()
    del raw[missing]
    with pytest.raises(ConfigError, match=missing):
        parse_hf_config(raw)


def test_v32_architecture_without_any_index_key():
    raw = v32_671b()
    for k in ("index_n_heads", "index_head_dim", "index_topk"):
        del raw[k]
    with pytest.raises(ConfigError, match="index_topk"):
        parse_hf_config(raw)


def _set(**kv):
    def edit(raw):
        raw.update(kv)
    return edit


def _drop(key):
    def edit(raw):
        del raw[key]
    return edit


def _quant(**kv):
    def edit(raw):
        raw["quantization_config"].update(kv)
    return edit


def _rope(**kv):
    def edit(raw):
        raw["rope_scaling"].update(kv)
    return edit


BAD = [
    (_set(architectures=["LlamaForCausalLM"]), "architectures"),
    (_set(architectures=[]), "architectures"),
    (_set(model_type="deepseek_v3"), "model_type"),
    (_drop("hidden_size"), "hidden_size"),
    (_set(hidden_size="7168"), "hidden_size"),
    (_set(num_hidden_layers=0), "num_hidden_layers"),
    (_set(num_attention_heads=True), "num_attention_heads"),
    (_set(topk_group=9), "topk_group"),
    (_set(n_routed_experts=250), "n_routed_experts"),
    (_set(num_experts_per_tok=300), "num_experts_per_tok"),
    (_set(num_experts_per_tok=129), "num_experts_per_tok"),  # > 4 groups x 32 experts
    (_set(n_group=256), "n_group"),
    (_set(index_topk=0), "index_topk"),
    (_set(index_topk=-5), "index_topk"),
    (_set(index_head_dim=64), "index_head_dim"),
    (_set(qk_rope_head_dim=63), "qk_rope_head_dim"),
    (_set(first_k_dense_replace=62), "first_k_dense_replace"),
    (_set(scoring_func="softmax"), "scoring_func"),
    (_set(topk_method="greedy"), "topk_method"),
    (_set(hidden_act="gelu"), "hidden_act"),
    (_set(bos_token_id=129280), "bos_token_id"),
    (_set(rope_theta=float("nan")), "rope_theta"),
    (_set(rope_scaling="yarn"), "rope_scaling"),
    (_rope(type="linear"), "rope_scaling.type"),
    (_rope(factor=0.5), "rope_scaling.factor"),
    (_rope(original_max_position_embeddings=200000), "rope_scaling.original_max_position_embeddings"),
    (_quant(weight_block_size=[64, 64]), "quantization_config.weight_block_size"),
    (_quant(scale_fmt="e8m0"), "quantization_config.scale_fmt"),
    (_quant(fmt="e5m2"), "quantization_config.fmt"),
    (_quant(quant_method="awq"), "quantization_config.quant_method"),
    (_set(tie_word_embeddings="no"), "tie_word_embeddings"),
    (_set(q_lora_rank=None), "q_lora_rank"),  # the indexer needs the q latent
]


@pytest.mark.parametrize(("edit", "field"), BAD, ids=[f for _, f in BAD])
def test_bad_field_gives_one_line_naming_it(edit, field):
    raw = v32_671b()
    edit(raw)
    with pytest.raises(ConfigError) as info:
        parse_hf_config(raw)
    msg = str(info.value)
    assert f"config.json: {field}:" in msg, msg
    assert "\n" not in msg


def test_not_a_dict():
    with pytest.raises(ConfigError, match="JSON object"):
        parse_hf_config(["not", "a", "config"])  # type: ignore[arg-type]


def test_architecture_from_model_type_alone_and_eos_list():
    raw = v32_671b()
    del raw["architectures"]
    raw["eos_token_id"] = [1, 2]
    cfg = parse_hf_config(raw)
    assert cfg.architecture == "DeepseekV32ForCausalLM" and cfg.eos_token_id == 1
