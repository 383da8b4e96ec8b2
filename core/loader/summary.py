"""What ``dsa-runtime inspect`` reports: parameters, weight bytes, KV bytes per token, and a meta-device build.

KV bytes per token and layer (layouts in the ``dsa_runtime.families`` docstring): the MLA cache holds the 512 latent
values and the 64 rotated rope values, 576 bf16 = 1152 bytes, or in the FP8 layout 512 e4m3 + 4 fp32 block
scales + 64 bf16 = 656 bytes; V3.2's index-K cache holds 128 e4m3 + one fp32 scale = 132 bytes. Every layer
has them, the MTP layers included (they own a separate cache), so the 671B V3.2 needs 62 x (656 + 132) =
48,856 bytes per token with the FP8 MLA layout.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dsa_runtime.loader.spec import TensorSpec, expected_tensors, is_mtp_tensor
from dsa_runtime.model.config import ModelConfig

# Bytes per element of the dtype each kind is stored in by the released checkpoints.
KIND_BYTES = {"fp8": 1, "bf16": 2, "fp32": 4, "norm": 2}
SAFETENSORS_KIND = {"F8_E4M3": "fp8", "BF16": "bf16", "F32": "fp32"}


@dataclass(frozen=True)
class KVBytes:
    """Per-token KV cache bytes of one layer, and the number of layers that hold a cache."""

    mla_bf16: int
    mla_fp8: int
    index_k: int
    layers: int

    def per_token(self, layout: str) -> int:
        """All layers, one token: ``layout`` ``"bf16"`` or ``"fp8_656"`` MLA plus the index-K cache."""
        mla = self.mla_bf16 if layout == "bf16" else self.mla_fp8
        return (mla + self.index_k) * self.layers


def kv_bytes(config: ModelConfig) -> KVBytes:
    latent, rope = config.kv_lora_rank, config.qk_rope_head_dim
    fp8 = latent + 4 * -(-latent // 128) + 2 * rope
    index = (config.index_head_dim + 4) if config.is_dsa and config.index_head_dim else 0
    return KVBytes(2 * (latent + rope), fp8, index, config.num_hidden_layers + config.num_nextn_predict_layers)


@dataclass
class ModelSummary:
    """Everything ``inspect`` prints (also as JSON)."""

    architecture: str
    source: str
    dense_layers: int
    moe_layers: int
    mtp_layers: int
    params_main: int
    params_mtp: int
    weight_bytes_main: int
    weight_bytes_mtp: int
    bytes_by_kind: dict[str, int]
    num_tensors: int
    kv: KVBytes
    index_topk: int | None
    max_position_embeddings: int
    scale_fmt: str
    meta_build: str = ""
    tokenizer_vocab: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["kv"]["per_token_bf16"] = self.kv.per_token("bf16")
        d["kv"]["per_token_fp8_656"] = self.kv.per_token("fp8_656")
        return d


def _base(config: ModelConfig, source: str, sizes: dict[str, tuple[int, str, tuple[int, ...]]]) -> ModelSummary:
    """``sizes``: tensor name -> (bytes, kind, shape)."""
    params = {False: 0, True: 0}
    wbytes = {False: 0, True: 0}
    by_kind: dict[str, int] = {}
    for name, (nbytes, kind, shape) in sizes.items():
        mtp = is_mtp_tensor(name, config)
        wbytes[mtp] += nbytes
        by_kind[kind] = by_kind.get(kind, 0) + nbytes
        if not name.endswith("_scale_inv"):
            n = 1
            for d in shape:
                n *= d
            params[mtp] += n
    n_layers = config.num_hidden_layers
    moe = sum(config.is_moe_layer(layer) for layer in range(n_layers))
    return ModelSummary(
        architecture=config.architecture, source=source, dense_layers=n_layers - moe, moe_layers=moe,
        mtp_layers=config.num_nextn_predict_layers, params_main=params[False], params_mtp=params[True],
        weight_bytes_main=wbytes[False], weight_bytes_mtp=wbytes[True], bytes_by_kind=by_kind,
        num_tensors=len(sizes), kv=kv_bytes(config), index_topk=config.index_topk,
        max_position_embeddings=config.max_position_embeddings, scale_fmt=config.scale_fmt,
    )


def meta_tensors(specs: dict[str, TensorSpec]):
    """Every tensor of ``specs`` on the ``meta`` device (shapes and dtypes only, no storage)."""
    import torch

    dtypes = {"fp8": torch.float8_e4m3fn, "bf16": torch.bfloat16, "fp32": torch.float32, "norm": torch.bfloat16}
    return {name: torch.empty(s.shape, dtype=dtypes[s.kind], device="meta") for name, s in specs.items()}


def build_on_meta(config: ModelConfig) -> str:
    """Build the full-size model on the ``meta`` device; returns a sentence saying how.

    Uses the runtime's model class (:class:`dsa_runtime.model.deepseek.DeepseekModel`) when it is installed,
    which exercises the real weight plumbing (dequantization, expert stacking) without allocating memory;
    otherwise only the checkpoint's tensors are created on ``meta``.
    """
    import torch

    tensors = meta_tensors(expected_tensors(config))
    try:
        from dsa_runtime.model.deepseek import DeepseekModel
    except ImportError:
        return f"{len(tensors):,} checkpoint tensors created on the meta device (model class not available)"
    with torch.inference_mode():
        DeepseekModel(config, tensors, dtype=torch.bfloat16, device=torch.device("meta"))
    return f"DeepseekModel built on the meta device from {len(tensors):,} tensors (no memory allocated)"


def summarize_config(config: ModelConfig, *, build: bool = True) -> ModelSummary:
    """Summary of a config alone (sizes as the released checkpoints store them), optionally built on meta."""
    specs = expected_tensors(config)
    # labelled by storage dtype, as a checkpoint's headers would be (norms are bf16)
    sizes = {n: (s.numel * KIND_BYTES[s.kind], "bf16" if s.kind == "norm" else s.kind, s.shape)
             for n, s in specs.items()}
    summary = _base(config, "config.json", sizes)
    if build:
        summary.meta_build = build_on_meta(config)
    return summary


def summarize_checkpoint(path: str | Path) -> ModelSummary:
    """Summary of a checkpoint folder from its validated headers (no tensor data is read)."""
    from dsa_runtime.loader.tokenizer import load_tokenizer
    from dsa_runtime.loader.validate import inspect_layout

    layout = inspect_layout(path)
    sizes = {}
    for shard in layout.shards.values():
        for name, e in shard.entries.items():
            sizes[name] = (e.nbytes, SAFETENSORS_KIND.get(e.dtype, e.dtype.lower()), e.shape)
    summary = _base(layout.config, f"checkpoint {layout.folder} ({len(layout.shards)} shard(s))", sizes)
    if not layout.has_mtp:
        summary.extra["note"] = "no MTP layer in the checkpoint"
    if (layout.folder / "tokenizer.json").is_file():
        summary.tokenizer_vocab = load_tokenizer(layout.folder).vocab_size
    return summary
