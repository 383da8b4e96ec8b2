"""Model configuration: the fields of a Hugging Face ``config.json`` for DeepSeek V3 / R1 / V3.1 / V3.2.

One frozen dataclass, :class:`ModelConfig`, holds every dimension the model, the loader, the checkpoint
generator and the memory planner need. :meth:`ModelConfig.from_hf` parses ``DeepseekV3ForCausalLM`` and
``DeepseekV32ForCausalLM`` configs; DSA (the lightning
indexer and sparse top-k attention) is on exactly when the ``index_*`` keys are present.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

ARCHITECTURES = ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM")


@dataclass(frozen=True)
class QuantConfig:
    """``quantization_config``: FP8 e4m3 weights with 128x128 block scales.

    ``scale_fmt`` is ``"ue8m0"`` (V3.1, V3.2: power-of-two scales, also used for activations) or
    ``"float"`` (V3 / R1 have no ``scale_fmt`` key).
    """

    quant_method: str = "fp8"
    fmt: str = "e4m3"
    weight_block_size: tuple[int, int] = (128, 128)
    scale_fmt: str = "float"
    activation_scheme: str = "dynamic"


@dataclass(frozen=True)
class RopeScaling:
    """YaRN rope scaling (``rope_scaling`` with ``type``/``rope_type`` ``"yarn"``); None in ModelConfig = plain rope."""

    factor: float = 40.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 1.0


@dataclass(frozen=True)
class ModelConfig:
    """Dimensions of a DeepSeek V3/V3.2 decoder (HF key names).

    ``index_n_heads`` / ``index_head_dim`` / ``index_topk`` are None for the dense V3 family.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    first_k_dense_replace: int
    num_attention_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    n_group: int
    topk_group: int
    routed_scaling_factor: float
    norm_topk_prob: bool = True
    scoring_func: str = "sigmoid"
    topk_method: str = "noaux_tc"
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 163840
    rms_norm_eps: float = 1e-6
    index_n_heads: int | None = None
    index_head_dim: int | None = None
    index_topk: int | None = None
    # IndexCache: per main layer, True when it reuses the previous Full layer's top-k ("S"); all False by
    # default (config keys index_topk_freq / index_topk_pattern / index_skip_topk_offset).
    index_reuse: tuple[bool, ...] = ()
    num_nextn_predict_layers: int = 0
    bos_token_id: int = 0
    eos_token_id: int = 1
    tie_word_embeddings: bool = False
    quantization: QuantConfig | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # --- derived -----------------------------------------------------------------------------------
    @property
    def is_dsa(self) -> bool:
        """True for V3.2 (lightning indexer + sparse top-k attention)."""
        return self.index_topk is not None

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def scale_fmt(self) -> str:
        """Activation / FP8 scale rule of the checkpoint (``float`` when not quantized or V3/R1)."""
        return self.quantization.scale_fmt if self.quantization else "float"

    def reuses_topk(self, layer: int) -> bool:
        """IndexCache: whether main layer ``layer`` skips its indexer and reuses the last Full layer's top-k."""
        return layer < len(self.index_reuse) and self.index_reuse[layer]

    def is_moe_layer(self, layer: int) -> bool:
        return self.n_routed_experts > 0 and layer >= self.first_k_dense_replace

    @property
    def softmax_scale(self) -> float:
        """MLA softmax scale: ``qk_head_dim**-0.5 * m**2`` with YaRN's mscale (0.135234 for V3.2)."""
        scale = self.qk_head_dim**-0.5
        rs = self.rope_scaling
        if rs is not None and rs.mscale_all_dim:
            m = 0.1 * rs.mscale_all_dim * math.log(rs.factor) + 1.0 if rs.factor > 1 else 1.0
            scale *= m * m
        return scale

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> ModelConfig:
        """Parse a ``config.json`` dict; raises ``ConfigError`` naming the offending field."""
        from dsa_runtime.model.config_parse import parse_hf_config

        return parse_hf_config(raw)
