"""Parse a Hugging Face ``config.json`` dict into :class:`~dsa_runtime.model.config.ModelConfig`.

Accepts ``DeepseekV3ForCausalLM`` (``model_type`` ``deepseek_v3``: V3, R1, V3.1) and ``DeepseekV32ForCausalLM``
(``deepseek_v32``: V3.2-Exp, V3.2, V3.2-Speciale). DSA (the lightning indexer)
is on exactly when the ``index_*`` keys are present; a partial set is an error naming the missing key.
Every problem raises :class:`~dsa_runtime.errors.ConfigError` with one line that names the field.
"""

from __future__ import annotations

import math
from typing import Any

from dsa_runtime.errors import ConfigError
from dsa_runtime.model.config import ARCHITECTURES, ModelConfig, QuantConfig, RopeScaling

MODEL_TYPES = {"DeepseekV3ForCausalLM": "deepseek_v3", "DeepseekV32ForCausalLM": "deepseek_v32"}
INDEX_KEYS = ("index_n_heads", "index_head_dim", "index_topk")
SCALE_FMTS = ("ue8m0", "float")

# Keys the parser reads; anything else is kept in ModelConfig.extra for tools that want it.
_KNOWN = {
    "architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
    "num_hidden_layers", "first_k_dense_replace", "num_attention_heads", "q_lora_rank", "kv_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "n_shared_experts",
    "num_experts_per_tok", "n_group", "topk_group", "routed_scaling_factor", "norm_topk_prob", "scoring_func",
    "topk_method", "rope_theta", "rope_scaling", "max_position_embeddings", "rms_norm_eps", "num_nextn_predict_layers",
    "bos_token_id", "eos_token_id", "tie_word_embeddings", "quantization_config", *INDEX_KEYS,
    "index_topk_freq", "index_topk_pattern", "index_skip_topk_offset",
}


def _index_reuse(raw: dict[str, Any], layers: int, is_dsa: bool) -> tuple[bool, ...]:
    """IndexCache (SGLang / vLLM ``index_topk_freq``, ``index_topk_pattern``, ``index_skip_topk_offset``): per
    main layer, True when it reuses the previous Full layer's top-k instead of running its indexer ("S").

    A pattern string of ``F`` / ``S`` per layer wins; else with ``index_topk_freq`` N > 1 layer L is Shared iff
    ``max(L - offset + 1, 0) % N != 0`` (offset default 2: layers 0 and 1 stay Full). Layer 0 is always Full.
    """
    pattern, freq = raw.get("index_topk_pattern"), raw.get("index_topk_freq")
    offset = raw.get("index_skip_topk_offset")
    if pattern is None and freq is None and offset is None:
        return (False,) * layers
    if not is_dsa:
        raise _err("index_topk_pattern" if pattern is not None else "index_topk_freq",
                   "IndexCache needs a DSA model (index_topk)")
    if pattern is not None:
        if not isinstance(pattern, str) or len(pattern) != layers or set(pattern) - {"F", "S"}:
            raise _err("index_topk_pattern", f"must be a string of {layers} letters F (full) / S (shared), "
                       f"got {pattern!r}")
        if pattern[0] != "F":
            raise _err("index_topk_pattern", "layer 0 must be F (it has no earlier layer to share from)")
        return tuple(c == "S" for c in pattern)
    freq = _int(raw, "index_topk_freq", default=1)
    offset = _int(raw, "index_skip_topk_offset", default=2)
    if freq <= 1:
        return (False,) * layers
    return tuple(layer > 0 and max(layer - offset + 1, 0) % freq != 0 for layer in range(layers))


def _err(field: str, msg: str) -> ConfigError:
    return ConfigError(f"config.json: {field}: {msg}")


def _int(raw: dict[str, Any], key: str, *, minimum: int = 1, default: Any = ..., where: str = "") -> int:
    """An integer field ``>= minimum`` (bools are not integers; integral floats such as 4096.0 are accepted)."""
    name = where + key
    if key not in raw or raw[key] is None:
        if default is ...:
            raise _err(name, "missing (required)")
        return default
    value = raw[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _err(name, f"expected an integer, got {value!r}")
    if value < minimum:
        raise _err(name, f"must be >= {minimum}, got {value}")
    return value


def _float(raw: dict[str, Any], key: str, default: Any = ..., *, positive: bool = True, where: str = "") -> float:
    name = where + key
    if key not in raw or raw[key] is None:
        if default is ...:
            raise _err(name, "missing (required)")
        return float(default)
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _err(name, f"expected a finite number, got {value!r}")
    if positive and value <= 0:
        raise _err(name, f"must be > 0, got {value}")
    return float(value)


def _bool(raw: dict[str, Any], key: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise _err(key, f"expected true or false, got {value!r}")
    return value


def _choice(raw: dict[str, Any], key: str, default: str, allowed: tuple[str, ...], *, where: str = "") -> str:
    value = raw.get(key, default)
    if value is None:
        value = default
    if value not in allowed:
        raise _err(where + key, f"{value!r} is not supported (expected {' or '.join(map(repr, allowed))})")
    return value


def _architecture(raw: dict[str, Any]) -> str:
    archs = raw.get("architectures")
    model_type = raw.get("model_type")
    if archs is None:
        # Some hand-written configs carry only model_type; map it back when it is unambiguous.
        by_type = {v: k for k, v in MODEL_TYPES.items()}
        if model_type in by_type:
            return by_type[model_type]
        raise _err("architectures", f"missing, and model_type {model_type!r} is not deepseek_v3 or deepseek_v32")
    if isinstance(archs, str):
        archs = [archs]
    if not isinstance(archs, list) or not archs:
        raise _err("architectures", f"expected a non-empty list, got {archs!r}")
    known = [a for a in archs if a in ARCHITECTURES]
    if not known:
        raise _err("architectures", f"{archs!r} is not supported (expected one of {', '.join(ARCHITECTURES)})")
    arch = known[0]
    if model_type is not None and model_type != MODEL_TYPES[arch]:
        raise _err("model_type", f"{model_type!r} does not match architecture {arch} (expected {MODEL_TYPES[arch]!r})")
    return arch


def _rope_scaling(raw: dict[str, Any], max_pos: int) -> RopeScaling | None:
    rs = raw.get("rope_scaling")
    if rs is None:
        return None
    if not isinstance(rs, dict):
        raise _err("rope_scaling", f"expected an object or null, got {rs!r}")
    kind = rs.get("rope_type", rs.get("type"))
    if kind != "yarn":
        raise _err("rope_scaling.type", f"{kind!r} is not supported (only 'yarn')")
    w = "rope_scaling."
    factor = _float(rs, "factor", where=w)
    if factor < 1:
        raise _err("rope_scaling.factor", f"must be >= 1, got {factor}")
    original = _int(rs, "original_max_position_embeddings", default=4096, where=w)
    if original > max_pos:
        raise _err(
            "rope_scaling.original_max_position_embeddings",
            f"{original} exceeds max_position_embeddings {max_pos}",
        )
    beta_fast = _float(rs, "beta_fast", 32.0, where=w)
    beta_slow = _float(rs, "beta_slow", 1.0, where=w)
    if beta_slow > beta_fast:
        raise _err("rope_scaling.beta_slow", f"{beta_slow} is greater than beta_fast {beta_fast}")
    return RopeScaling(
        factor=factor,
        original_max_position_embeddings=original,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
        mscale=_float(rs, "mscale", 1.0, positive=False, where=w),
        mscale_all_dim=_float(rs, "mscale_all_dim", 1.0, positive=False, where=w),
    )


def _quantization(raw: dict[str, Any]) -> QuantConfig | None:
    qc = raw.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise _err("quantization_config", f"expected an object or null, got {qc!r}")
    w = "quantization_config."
    method = _choice(qc, "quant_method", "", ("fp8",), where=w)
    fmt = _choice(qc, "fmt", "e4m3", ("e4m3",), where=w)
    block = qc.get("weight_block_size", [128, 128])
    if not isinstance(block, (list, tuple)) or [int(b) if isinstance(b, int) else b for b in block] != [128, 128]:
        raise _err("quantization_config.weight_block_size", f"{block!r} is not supported (expected [128, 128])")
    scale_fmt = _choice(qc, "scale_fmt", "float", SCALE_FMTS, where=w)
    activation = _choice(qc, "activation_scheme", "dynamic", ("dynamic",), where=w)
    return QuantConfig(method, fmt, (128, 128), scale_fmt, activation)


def _index_fields(raw: dict[str, Any], arch: str) -> tuple[int | None, int | None, int | None]:
    present = [k for k in INDEX_KEYS if raw.get(k) is not None]
    if not present:
        if arch == "DeepseekV32ForCausalLM":
            raise _err("index_topk", f"missing: {arch} needs {', '.join(INDEX_KEYS)} (the lightning indexer)")
        return None, None, None
    missing = [k for k in INDEX_KEYS if k not in present]
    if missing:
        raise _err(missing[0], f"missing while {', '.join(present)} is set (DSA needs all of {', '.join(INDEX_KEYS)})")
    return _int(raw, "index_n_heads"), _int(raw, "index_head_dim"), _int(raw, "index_topk")


def _eos(raw: dict[str, Any]) -> int:
    eos = raw.get("eos_token_id", 1)
    if isinstance(eos, list) and eos:
        # generation configs sometimes list several end tokens; the first is the tokenizer's eos
        eos = eos[0]
    return _int({"eos_token_id": eos}, "eos_token_id", minimum=0)


def parse_hf_config(raw: dict[str, Any]) -> ModelConfig:
    """Validate and convert a ``config.json`` mapping; raises ConfigError naming the first bad field."""
    if not isinstance(raw, dict):
        raise ConfigError(f"config.json: expected a JSON object, got {type(raw).__name__}")
    arch = _architecture(raw)
    hidden_act = raw.get("hidden_act", "silu")
    if hidden_act != "silu":
        raise _err("hidden_act", f"{hidden_act!r} is not supported (expected 'silu')")
    layers = _int(raw, "num_hidden_layers")
    max_pos = _int(raw, "max_position_embeddings", default=163840)
    q_lora = raw.get("q_lora_rank")
    q_lora = None if q_lora is None else _int(raw, "q_lora_rank")
    rope_dim = _int(raw, "qk_rope_head_dim")
    if rope_dim % 2:
        raise _err("qk_rope_head_dim", f"must be even (rope rotates pairs), got {rope_dim}")

    n_routed = _int(raw, "n_routed_experts", minimum=0, default=0)
    first_dense = _int(raw, "first_k_dense_replace", minimum=0, default=0)
    if first_dense > layers:
        raise _err("first_k_dense_replace", f"{first_dense} exceeds num_hidden_layers {layers}")
    moe_inter, n_shared, per_tok, n_group, topk_group = 0, 0, 0, 1, 1
    if n_routed:
        moe_inter = _int(raw, "moe_intermediate_size")
        n_shared = _int(raw, "n_shared_experts", minimum=0, default=0)
        per_tok = _int(raw, "num_experts_per_tok")
        n_group = _int(raw, "n_group", default=1)
        topk_group = _int(raw, "topk_group", default=1)
        if per_tok > n_routed:
            raise _err("num_experts_per_tok", f"{per_tok} exceeds n_routed_experts {n_routed}")
        if n_routed % n_group:
            raise _err("n_routed_experts", f"{n_routed} is not divisible by n_group {n_group}")
        if topk_group > n_group:
            raise _err("topk_group", f"{topk_group} exceeds n_group {n_group}")
        per_group = n_routed // n_group
        if n_group > 1 and per_group < 2:
            raise _err("n_group", f"{n_group} groups leave {per_group} expert per group (group score sums the top 2)")
        if per_tok > topk_group * per_group:
            raise _err(
                "num_experts_per_tok",
                f"{per_tok} exceeds the {topk_group * per_group} experts of topk_group={topk_group} groups",
            )
    scoring = _choice(raw, "scoring_func", "sigmoid", ("sigmoid",))
    topk_method = _choice(raw, "topk_method", "noaux_tc", ("noaux_tc",))

    idx_heads, idx_dim, idx_topk = _index_fields(raw, arch)
    if idx_dim is not None and (idx_dim <= rope_dim or idx_dim % 2):
        raise _err("index_head_dim", f"{idx_dim} must be even and larger than qk_rope_head_dim {rope_dim}")
    if idx_dim is not None and q_lora is None:
        raise _err("q_lora_rank", "missing: the lightning indexer reads the q_lora_rank latent")

    bos = _int(raw, "bos_token_id", minimum=0, default=0)
    vocab = _int(raw, "vocab_size")
    eos = _eos(raw)
    for key, tok in (("bos_token_id", bos), ("eos_token_id", eos)):
        if tok >= vocab:
            raise _err(key, f"{tok} is outside vocab_size {vocab}")
    # The dense FFN width only matters when some layer is dense (all of them without routed experts).
    has_dense = first_dense > 0 or not n_routed
    intermediate = _int(raw, "intermediate_size") if has_dense else _int(raw, "intermediate_size", minimum=0, default=0)
    extra = {k: v for k, v in raw.items() if k not in _KNOWN}
    return ModelConfig(
        architecture=arch,
        vocab_size=vocab,
        hidden_size=_int(raw, "hidden_size"),
        intermediate_size=intermediate,
        moe_intermediate_size=moe_inter,
        num_hidden_layers=layers,
        first_k_dense_replace=first_dense,
        num_attention_heads=_int(raw, "num_attention_heads"),
        q_lora_rank=q_lora,
        kv_lora_rank=_int(raw, "kv_lora_rank"),
        qk_nope_head_dim=_int(raw, "qk_nope_head_dim"),
        qk_rope_head_dim=rope_dim,
        v_head_dim=_int(raw, "v_head_dim"),
        n_routed_experts=n_routed,
        n_shared_experts=n_shared,
        num_experts_per_tok=per_tok,
        n_group=n_group,
        topk_group=topk_group,
        routed_scaling_factor=_float(raw, "routed_scaling_factor", 1.0),
        norm_topk_prob=_bool(raw, "norm_topk_prob", True),
        scoring_func=scoring,
        topk_method=topk_method,
        rope_theta=_float(raw, "rope_theta", 10000.0),
        rope_scaling=_rope_scaling(raw, max_pos),
        max_position_embeddings=max_pos,
        rms_norm_eps=_float(raw, "rms_norm_eps", 1e-6),
        index_n_heads=idx_heads,
        index_head_dim=idx_dim,
        index_topk=idx_topk,
        index_reuse=_index_reuse(raw, layers, idx_topk is not None),
        num_nextn_predict_layers=_int(raw, "num_nextn_predict_layers", minimum=0, default=0),
        bos_token_id=bos,
        eos_token_id=eos,
        tie_word_embeddings=_bool(raw, "tie_word_embeddings", False),
        quantization=_quantization(raw),
        extra=extra,
    )
