"""Tiny random-checkpoint presets, written as Hugging Face ``config.json`` dicts (real key names).

The kernel-facing widths stay those of the 671B models (``kv_lora_rank`` 512, ``qk_rope_head_dim`` 64,
``index_head_dim`` 128, so one MLA cache row is 576 values and one index-K row 132 bytes) and every kernel
path, GPU ones included, runs on them. Everything else shrinks so that the whole model is ~10 MB and
``dsa-runtime generate`` answers in seconds on two CPU cores:

==========================  ==========  =========================================================
field                       tiny-v32    note
==========================  ==========  =========================================================
hidden_size                 256
num_hidden_layers           3           layer 0 dense (``first_k_dense_replace`` 1), layers 1-2 MoE
num_attention_heads         4
q_lora_rank                 128
qk_nope / qk_rope / v       64/64/64    qk_head_dim 128
n_routed_experts            8           2 groups of 4, ``topk_group`` 1, 2 experts per token, 1 shared
moe / dense intermediate    128 / 512
vocab_size                  1024        exactly the tokenizer's size (no unused embedding rows)
index_n_heads / topk        4 / 32      ``index_topk`` far below ``max_position_embeddings`` 4096
rope_scaling                YaRN x4     from 1024 original positions
num_nextn_predict_layers    1           the MTP layer is ``model.layers.3``
quantization_config         fp8 e4m3    ``scale_fmt`` ue8m0 (tiny-v3: no scale_fmt, i.e. float)
==========================  ==========  =========================================================

``tiny-v3`` is the same network as ``DeepseekV3ForCausalLM`` without the ``index_*`` keys (dense MLA).
"""

from __future__ import annotations

import copy
from typing import Any

from dsa_runtime.errors import ConfigError

TINY_VOCAB_SIZE = 1024

_TINY_COMMON: dict[str, Any] = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 256,
    "initializer_range": 0.02,
    "intermediate_size": 512,
    "kv_lora_rank": 512,
    "max_position_embeddings": 4096,
    "moe_intermediate_size": 128,
    "n_group": 2,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 3,
    "num_key_value_heads": 4,
    "num_nextn_predict_layers": 1,
    "q_lora_rank": 128,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 4,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 1024,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "v_head_dim": 64,
    "vocab_size": TINY_VOCAB_SIZE,
}

_TINY_V32: dict[str, Any] = {
    **_TINY_COMMON,
    "architectures": ["DeepseekV32ForCausalLM"],
    "model_type": "deepseek_v32",
    "index_head_dim": 128,
    "index_n_heads": 4,
    "index_topk": 32,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "scale_fmt": "ue8m0",
        "weight_block_size": [128, 128],
    },
}

_TINY_V3: dict[str, Any] = {
    **_TINY_COMMON,
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
}

# The trained embedded chat model (docs/tiny-model.md): the tiny-v32 widths with 5 layers, larger experts, a
# 3072-id tokenizer and index_topk 128, well below the 1024-token training context, and one MTP layer (trained
# after the main model by train/train_nextn.py; it ships without the MTP copies of the embedding and head).
_TINY_CHAT: dict[str, Any] = {
    **_TINY_V32,
    "num_hidden_layers": 5,
    "intermediate_size": 768,
    "moe_intermediate_size": 256,
    "num_nextn_predict_layers": 1,
    "index_topk": 128,
    "vocab_size": 3072,
}

PRESETS: dict[str, dict[str, Any]] = {"tiny-v32": _TINY_V32, "tiny-v3": _TINY_V3, "tiny-chat": _TINY_CHAT}
DEFAULT_PRESET = "tiny-v32"


def preset_config(name: str) -> dict[str, Any]:
    """A fresh (deep-copied) ``config.json`` dict of the preset ``name``; ConfigError for an unknown name."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r} (expected one of {', '.join(PRESETS)})")
    return copy.deepcopy(PRESETS[name])
