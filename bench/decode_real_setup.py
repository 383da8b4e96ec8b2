"""Model, weights, KV cache and byte counts of ``bench/decode_real_gpu.py`` (decode at DeepSeek-V3.2's real sizes).

* :func:`real_config`: V3.2's published dimensions with ``num_hidden_layers`` cut to what one GPU holds (layer 0..
  ``dense - 1`` dense, the rest MoE), the FP8 ``quantization_config`` kept (e4m3, 128x128 blocks, ue8m0), no MTP
  layer; :func:`dry_config`: the tiny V3.2 preset the same way, for ``--dry-run``.
* :func:`random_fp8_state`: every tensor of :func:`~dsa_runtime.loader.spec.expected_tensors` drawn directly on
  the target device, in the dtypes of an FP8 checkpoint (what ``loader.random_init.random_state_dict`` gives, at
  a few seconds instead of hours for 11 GB of experts a layer).
* :func:`fill_cache`: random but valid MLA rows and index-K rows in every page of the cache, written through the
  resolved ``kv_quant`` / ``indexer`` kernels (a 32K-token prefill of 128 requests would take far too long).
* :func:`step_bytes`: the bytes one decode step has to read (the roofline's numerator).
"""

from __future__ import annotations

import copy
import math
import os
import re
import sys
from collections.abc import Iterable

import torch
from torch import Tensor

from dsa_runtime.families import FP8_MAX, INDEX_K_ROW_BYTES
from dsa_runtime.loader.spec import TensorSpec, expected_tensors
from dsa_runtime.model.config import ModelConfig

E4M3 = torch.float8_e4m3fn
NORM_NOISE = 0.02  # as loader.random_init
BIAS_STD = 0.01
BLOCK_AMAX_SIGMAS = 4.5  # |max| of a 128x128 block of N(0, s^2) draws is ~4.2 s: the scale rule's amax
EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts\.)(\d+)(\..*)$")


def real_config(layers: int, dense: int = 1) -> ModelConfig:
    """DeepSeek-V3.2 (hidden 7168, 128 heads, MLA 1536 / 512, indexer 64 x 128 top-2048, 256 experts of 2048,
    top 8, 1 shared, vocab 129280) with ``layers`` layers, the first ``dense`` of them dense; FP8 e4m3 weights
    with ue8m0 block scales as the released checkpoint; no MTP layer."""
    if not 0 <= dense <= layers:
        raise ValueError(f"need 0 <= dense layers <= layers, got {dense} of {layers}")
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    if root not in sys.path:
        sys.path.insert(0, root)
    from tests.loader.real_configs import v32_671b

    raw = copy.deepcopy(v32_671b())
    raw.update(num_hidden_layers=layers, first_k_dense_replace=dense, num_nextn_predict_layers=0)
    return ModelConfig.from_hf(raw)


def dry_config() -> ModelConfig:
    """The tiny V3.2 preset (3 layers: 1 dense, 2 MoE; 4 heads; index_topk 32; FP8 ue8m0), no MTP layer."""
    from dsa_runtime.loader.presets import preset_config

    raw = preset_config("tiny-v32")
    raw["num_nextn_predict_layers"] = 0
    return ModelConfig.from_hf(raw)


# --- random weights on the device -------------------------------------------------------------------------------
def _scale_pow2(std: float) -> float:
    """The ue8m0 block scale a block of N(0, std^2) values gets: amax / 448 rounded up to a power of two."""
    return 2.0 ** math.ceil(math.log2(BLOCK_AMAX_SIGMAS * std / FP8_MAX))


def _fp8_pair(spec_shape: tuple[int, ...], scale_shape: tuple[int, ...], gen: torch.Generator,
              device: torch.device) -> tuple[Tensor, Tensor]:
    """An e4m3 ``[out, in]`` weight whose dequantisation is ~N(0, 1/in) and its fp32 ``[ceil(out/128),
    ceil(in/128)]`` power-of-two scales (one value: every block's amax rule gives the same power)."""
    std = spec_shape[-1] ** -0.5
    scale = _scale_pow2(std)
    w = torch.randn(spec_shape, generator=gen, device=device, dtype=torch.bfloat16)
    w8 = w.mul_(std / scale).clamp_(-FP8_MAX, FP8_MAX).to(E4M3)
    return w8, torch.full(scale_shape, scale, dtype=torch.float32, device=device)


def _plain(name: str, spec: TensorSpec, gen: torch.Generator, device: torch.device) -> Tensor:
    """A non-FP8 tensor with ``loader.random_init``'s statistics, in its checkpoint dtype (bf16; fp32 bias)."""
    dtype = torch.float32 if spec.kind == "fp32" else torch.bfloat16
    x = torch.randn(spec.shape, generator=gen, device=device, dtype=dtype)
    if name.endswith("embed_tokens.weight"):
        return x
    if spec.kind == "norm":
        x.mul_(NORM_NOISE)
        return x if name.endswith(".bias") else x.add_(1.0)
    if name.endswith("e_score_correction_bias"):
        return x.mul_(BIAS_STD)
    return x.mul_(spec.shape[-1] ** -0.5)


def random_fp8_state(config: ModelConfig, device: torch.device | str, seed: int = 0,
                     expert_pool: int | None = None) -> dict[str, Tensor]:
    """Every tensor of ``expected_tensors(config, fp8=True)`` (HF names), drawn on ``device``.

    dtypes as an FP8 checkpoint: linears ``float8_e4m3fn`` ``[out, in]`` with ``<name>_scale_inv`` fp32
    power-of-two block scales; embeddings, lm_head, router gate and ``weights_proj`` bf16; norms bf16 ~1;
    ``e_score_correction_bias`` fp32. One generator on ``device``, tensors drawn in spec order.

    Args:
        expert_pool: None: every routed expert drawn on its own; ``n``: expert ``j`` of a layer is the same
            tensor as expert ``j % n`` (names and shapes unchanged). The model stacks the experts into its own
            copy anyway, so a pool keeps the load's peak at one layer's experts instead of every layer's twice.
    Returns:
        ``{name: tensor}`` in ``expected_tensors`` order.
    """
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(int(seed))
    specs = expected_tensors(config, fp8=True)
    out: dict[str, Tensor] = {}
    for name, spec in specs.items():
        if name in out or name.endswith("_scale_inv"):
            continue  # a scale is drawn with its weight
        m = EXPERT.match(name) if expert_pool else None
        if m and int(m.group(2)) >= expert_pool:
            src = f"{m.group(1)}{int(m.group(2)) % expert_pool}{m.group(3)}"
            out[name] = out[src]
            if f"{name}_scale_inv" in specs:
                out[f"{name}_scale_inv"] = out[f"{src}_scale_inv"]
        elif spec.kind == "fp8":
            scale_name = f"{name}_scale_inv"
            out[name], out[scale_name] = _fp8_pair(spec.shape, specs[scale_name].shape, gen, dev)
        else:
            out[name] = _plain(name, spec, gen, dev)
    return {name: out[name] for name in specs}


# --- KV cache contents ------------------------------------------------------------------------------------------
def fill_cache(cache, kernels, config: ModelConfig, *, chunk: int = 1 << 16, seed: int = 1) -> None:
    """Random valid rows in every slot of pages ``1 ..`` of layer 0 (MLA latent ``c`` ~N(0, 1) ``[n, 512]`` and
    ``k_pe`` ``[n, 64]`` bf16 through ``kv_quant.store_mla``; index keys ~N(0, 1) ``[n, 128]`` bf16 through
    ``indexer.quantize_k`` + ``kv_quant.store_index_k``), in chunks of ``chunk`` slots, then copied into every
    other layer's pools (each layer keeps its own pool; equal contents cost nothing in a bandwidth benchmark)."""

    dev = cache.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    scale_fmt = "ue8m0" if config.scale_fmt == "ue8m0" else "float"
    lora, rope = config.kv_lora_rank, config.qk_rope_head_dim
    for start in range(cache.page_size, cache.num_slots, chunk):  # page 0 stays the zero page
        slots = torch.arange(start, min(start + chunk, cache.num_slots), device=dev)
        n = slots.shape[0]
        c = torch.randn(n, lora, generator=gen, device=dev, dtype=torch.bfloat16)
        k_pe = torch.randn(n, rope, generator=gen, device=dev, dtype=torch.bfloat16)
        kernels.kv_quant.store_mla(cache.mla[0], slots, c, k_pe, layout=cache.kv_layout)
        if cache.index_k:
            k = torch.randn(n, config.index_head_dim, generator=gen, device=dev, dtype=torch.bfloat16)
            k8, k_scale = kernels.indexer.quantize_k(k, scale_fmt=scale_fmt)
            kernels.kv_quant.store_index_k(cache.index_k[0], slots, k8, k_scale)
    for pools in (cache.mla, cache.index_k):
        for pool in pools[1:]:
            pool.copy_(pools[0])


# --- bytes a decode step reads ----------------------------------------------------------------------------------
def tensor_bytes(obj: object, *, skip: Iterable[object] = ()) -> int:
    """Bytes of every distinct tensor reachable from ``obj`` through attributes of runtime objects, lists, tuples
    and dicts (a storage counted once, by data pointer); objects in ``skip`` (by identity) are left out."""
    return _walk_bytes(obj, {id(s) for s in skip}, set(), 0)


def _walk_bytes(obj: object, skip: set[int], seen: set[tuple[int, int]], depth: int) -> int:
    if id(obj) in skip or depth > 6:
        return 0
    if isinstance(obj, Tensor):
        key = (obj.data_ptr(), obj.numel())
        if key in seen:
            return 0
        seen.add(key)
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        children: Iterable[object] = obj.values()
    elif isinstance(obj, (list, tuple)):
        children = obj
    elif type(obj).__module__.startswith("dsa_runtime") and hasattr(obj, "__dict__"):
        children = vars(obj).values()
    else:
        return 0
    return sum(_walk_bytes(c, skip, seen, depth + 1) for c in children)


def weight_bytes(model) -> dict[str, object]:
    """What the model holds, as the runner keeps it (attention and dense linears dequantised to the model dtype,
    experts FP8 + scales): ``dense`` bytes every step reads whatever the batch (every layer but its routed
    experts, final norm, lm_head), ``expert`` bytes of one routed expert per MoE layer (list, layer order),
    ``embed_row`` bytes of one embedding row, ``total`` everything."""
    dense, experts = 0, []
    for layer in model.layers:
        routed = getattr(getattr(layer, "ffn", None), "experts", None)
        # The MoE's received-rows counter (EP load figures) is a statistic, not a weight.
        skip = [routed, layer.ffn.tokens_received] if routed is not None else []
        dense += tensor_bytes(layer, skip=skip)
        if routed is not None:
            experts.append(tensor_bytes(routed) // routed.w13.shape[0])
    dense += tensor_bytes([model.norm, model.head])
    embed = model.embed
    row = embed.shape[1] * embed.element_size()
    total = dense + tensor_bytes(embed) + sum(e * model.config.n_routed_experts for e in experts)
    return {"dense": dense, "expert": experts, "embed_row": row, "total": total}


def uniform_distinct_experts(n_experts: int, top_k: int, tokens: int) -> float:
    """Expected distinct experts ``tokens`` tokens route to when each picks ``top_k`` of ``n_experts`` uniformly:
    ``E * (1 - (1 - k / E) ** tokens)``."""
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** tokens)


def mla_row_bytes(kv_layout: str) -> int:
    """Bytes of one cached MLA row: 656 (``fp8_656``) or 1152 (``bf16``, 576 x 2)."""
    from dsa_runtime.cache.kv_cache import mla_bytes_per_token

    return mla_bytes_per_token(kv_layout)


def step_bytes(config: ModelConfig, weights: dict[str, object], batch: int, context: int, kv_layout: str,
               distinct: list[float]) -> dict[str, float]:
    """Bytes one decode step of ``batch`` rows at ``context`` tokens must read at least.

    weights: the every-step weights, ``batch`` embedding rows and, per MoE layer, ``distinct[i]`` experts;
    kv: per layer and row the ``min(context, index_topk)`` selected MLA rows; index_k: per layer and row
    ``context`` index-K rows (132 B) the indexer scores.
    """
    layers = config.num_hidden_layers
    experts = sum(d * e for d, e in zip(distinct, weights["expert"], strict=True))  # type: ignore[arg-type]
    dense = float(weights["dense"]) + batch * float(weights["embed_row"])  # type: ignore[arg-type]
    selected = min(context, config.index_topk or context)
    kv = float(batch * layers * selected * mla_row_bytes(kv_layout))
    index_k = float(batch * layers * context * INDEX_K_ROW_BYTES) if config.is_dsa else 0.0
    return {"dense_weights": dense, "experts": experts, "kv": kv, "index_k": index_k,
            "total": dense + experts + kv + index_k}


def cache_bytes_per_page(config: ModelConfig, page_size: int, kv_layout: str) -> int:
    """KV cache bytes one page takes over every layer (MLA rows, plus index-K rows for DSA)."""
    per_token = mla_row_bytes(kv_layout) + (INDEX_K_ROW_BYTES if config.is_dsa else 0)
    return page_size * per_token * config.num_hidden_layers
