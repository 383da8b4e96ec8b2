"""Every tensor of a DeepSeek V3 / V3.2 Hugging Face checkpoint, by name, shape and kind.

The layout is that of the released checkpoints (docs/architecture.md, "Checkpoint layout"):
the main stack ``model.layers.0 .. N-1``, then the MTP (NextN) layers ``model.layers.N ..`` holding a full
decoder layer plus ``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.{norm,head}`` and ``embed_tokens``.
For the 671B V3 config this yields 91,991 tensors, the count of the published checkpoint.

Kinds (what the loader accepts as dtype):

* ``fp8``  -- ``float8_e4m3fn`` weight; its multiplier ``<name>_scale_inv`` is listed as kind ``fp32``
  with shape ``[ceil(out/128), ceil(in/128)]`` (partial edge blocks, e.g. 576 rows -> 5 blocks);
* ``bf16`` -- embeddings, lm_head, router gate, ``weights_proj``, ``eh_proj`` and every linear of an
  unquantized checkpoint (bf16, fp32 also accepted);
* ``fp32`` -- scales and ``e_score_correction_bias``;
* ``norm`` -- RMSNorm weights and the indexer's LayerNorm weight and bias (bf16 or fp32).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dsa_runtime.model.config import ModelConfig

Kind = Literal["fp8", "bf16", "fp32", "norm"]
BLOCK = 128


@dataclass(frozen=True)
class TensorSpec:
    """Expected shape and kind of one checkpoint tensor."""

    shape: tuple[int, ...]
    kind: Kind

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class _Builder:
    def __init__(self, fp8: bool) -> None:
        self.fp8 = fp8
        self.out: dict[str, TensorSpec] = {}

    def linear(self, name: str, out_dim: int, in_dim: int) -> None:
        """A weight that is FP8 (with its scale) in a quantized checkpoint, else bf16."""
        if self.fp8:
            self.out[f"{name}.weight"] = TensorSpec((out_dim, in_dim), "fp8")
            self.out[f"{name}.weight_scale_inv"] = TensorSpec((_cdiv(out_dim, BLOCK), _cdiv(in_dim, BLOCK)), "fp32")
        else:
            self.out[f"{name}.weight"] = TensorSpec((out_dim, in_dim), "bf16")

    def plain(self, name: str, shape: tuple[int, ...], kind: Kind) -> None:
        self.out[name] = TensorSpec(shape, kind)


def _attention(b: _Builder, cfg: ModelConfig, p: str) -> None:
    d, h = cfg.hidden_size, cfg.num_attention_heads
    a = f"{p}.self_attn"
    if cfg.q_lora_rank is None:
        b.linear(f"{a}.q_proj", h * cfg.qk_head_dim, d)
    else:
        b.linear(f"{a}.q_a_proj", cfg.q_lora_rank, d)
        b.plain(f"{a}.q_a_layernorm.weight", (cfg.q_lora_rank,), "norm")
        b.linear(f"{a}.q_b_proj", h * cfg.qk_head_dim, cfg.q_lora_rank)
    b.linear(f"{a}.kv_a_proj_with_mqa", cfg.kv_lora_rank + cfg.qk_rope_head_dim, d)
    b.plain(f"{a}.kv_a_layernorm.weight", (cfg.kv_lora_rank,), "norm")
    b.linear(f"{a}.kv_b_proj", h * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank)
    b.linear(f"{a}.o_proj", d, h * cfg.v_head_dim)
    if cfg.is_dsa:
        assert cfg.index_n_heads is not None and cfg.index_head_dim is not None and cfg.q_lora_rank is not None
        ix, dim = f"{a}.indexer", cfg.index_head_dim
        b.linear(f"{ix}.wq_b", cfg.index_n_heads * dim, cfg.q_lora_rank)
        b.linear(f"{ix}.wk", dim, d)
        b.plain(f"{ix}.k_norm.weight", (dim,), "norm")
        b.plain(f"{ix}.k_norm.bias", (dim,), "norm")
        b.plain(f"{ix}.weights_proj.weight", (cfg.index_n_heads, d), "bf16")


def _ffn(b: _Builder, p: str, d: int, inter: int) -> None:
    b.linear(f"{p}.gate_proj", inter, d)
    b.linear(f"{p}.up_proj", inter, d)
    b.linear(f"{p}.down_proj", d, inter)


def _decoder_layer(b: _Builder, cfg: ModelConfig, layer: int) -> None:
    p, d = f"model.layers.{layer}", cfg.hidden_size
    b.plain(f"{p}.input_layernorm.weight", (d,), "norm")
    _attention(b, cfg, p)
    b.plain(f"{p}.post_attention_layernorm.weight", (d,), "norm")
    if cfg.is_moe_layer(layer):
        e = cfg.n_routed_experts
        b.plain(f"{p}.mlp.gate.weight", (e, d), "bf16")
        b.plain(f"{p}.mlp.gate.e_score_correction_bias", (e,), "fp32")
        for j in range(e):
            _ffn(b, f"{p}.mlp.experts.{j}", d, cfg.moe_intermediate_size)
        if cfg.n_shared_experts:
            _ffn(b, f"{p}.mlp.shared_experts", d, cfg.n_shared_experts * cfg.moe_intermediate_size)
    else:
        _ffn(b, f"{p}.mlp", d, cfg.intermediate_size)


def _mtp_layer(b: _Builder, cfg: ModelConfig, layer: int) -> None:
    p, d, v = f"model.layers.{layer}", cfg.hidden_size, cfg.vocab_size
    _decoder_layer(b, cfg, layer)
    b.plain(f"{p}.embed_tokens.weight", (v, d), "bf16")
    b.plain(f"{p}.enorm.weight", (d,), "norm")
    b.plain(f"{p}.hnorm.weight", (d,), "norm")
    # eh_proj is bf16 in the released V3 checkpoint (not FP8), like the heads.
    b.plain(f"{p}.eh_proj.weight", (d, 2 * d), "bf16")
    b.plain(f"{p}.shared_head.norm.weight", (d,), "norm")
    b.plain(f"{p}.shared_head.head.weight", (v, d), "bf16")


def expected_tensors(config: ModelConfig, *, fp8: bool | None = None) -> dict[str, TensorSpec]:
    """Every tensor name of the checkpoint -> :class:`TensorSpec`, main stack first, then the MTP layers.

    ``fp8`` (default: whether the config has a ``quantization_config``) selects FP8 linears with scales.
    """
    b = _Builder(config.quantization is not None if fp8 is None else fp8)
    d, v = config.hidden_size, config.vocab_size
    b.plain("model.embed_tokens.weight", (v, d), "bf16")
    for layer in range(config.num_hidden_layers):
        _decoder_layer(b, config, layer)
    b.plain("model.norm.weight", (d,), "norm")
    b.plain("lm_head.weight", (v, d), "bf16")
    for k in range(config.num_nextn_predict_layers):
        _mtp_layer(b, config, config.num_hidden_layers + k)
    return b.out


def is_mtp_tensor(name: str, config: ModelConfig) -> bool:
    """True for tensors of the MTP layers (``model.layers.L.*`` with ``L >= num_hidden_layers``)."""
    if not name.startswith("model.layers."):
        return False
    layer = name.split(".", 3)[2]
    return layer.isdigit() and int(layer) >= config.num_hidden_layers


def is_shared_copy(name: str, config: ModelConfig) -> bool:
    """True for an MTP layer's ``embed_tokens`` / ``shared_head.head``: copies of the main model's embedding and
    head (DeepSeek ships them; engines use the main ones), so a checkpoint may omit them (the embedded tiny-chat
    model does, to stay small)."""
    return is_mtp_tensor(name, config) and name.endswith((".embed_tokens.weight", ".shared_head.head.weight"))


def parameter_count(specs: dict[str, TensorSpec], *, include_scales: bool = False) -> int:
    """Number of parameters (weights, norms, biases); scales are metadata unless ``include_scales``."""
    return sum(s.numel for n, s in specs.items() if include_scales or not n.endswith("_scale_inv"))
