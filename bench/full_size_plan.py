"""What ``bench/full_size.py`` runs, from shapes alone: the full-size V3.2 config at N layers, the topologies,
the bytes one rank holds (meta tensors, nothing allocated), the KV plan, the most layers that fit, and a decode
step's roofline. ``python bench/full_size.py --plan-only`` prints it for a command before its machine is lent."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import sys
from dataclasses import dataclass
from typing import Any

import torch

FP8_QUANT = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
             "weight_block_size": [128, 128], "scale_fmt": "ue8m0"}
GIB = 2**30


def model_config(model: str, layers: int, dense: int) -> Any:
    """V3.2's config at ``layers`` layers (the first ``dense`` dense), FP8 linears, no MTP layer."""
    from dsa_runtime.model.config import ModelConfig

    if model == "tiny":
        from dsa_runtime.loader.presets import preset_config

        raw = preset_config("tiny-v32")
    else:
        from tests.loader.real_configs import v32_671b

        raw = copy.deepcopy(v32_671b())
    raw["num_hidden_layers"] = layers
    raw["first_k_dense_replace"] = min(dense, layers)
    raw["num_nextn_predict_layers"] = 0
    raw["quantization_config"] = dict(FP8_QUANT)
    return ModelConfig.from_hf(raw)


@dataclass
class Topology:
    name: str
    tp: int
    dp: int
    ep: int = 1

    def parallel(self, timeout_s: float) -> Any:
        from dsa_runtime.distributed import ParallelConfig

        return ParallelConfig(tp=self.tp, dp=self.dp, enable_dp_attention=self.dp > 1, timeout_s=timeout_s,
                              reduce_dtype="bf16", ep=self.ep)


TOPOLOGY_NAMES = {"tp": "--tp N", "dp": "--tp N --dp N --enable-dp-attention", "ep": "--tp N --ep-size N",
                  "dpep": "--tp N --dp N --enable-dp-attention --ep-size N"}


def topologies(gpus: int, names: str) -> list[Topology]:
    g = gpus
    table = {"tp": Topology(f"tp{g}", g, 1), "dp": Topology(f"tp{g}-dp{g}", g, g),
             "ep": Topology(f"tp{g}-ep{g}", g, 1, g), "dpep": Topology(f"tp{g}-dp{g}-ep{g}", g, g, g)}
    unknown = [n for n in names.split(",") if n not in table]
    if unknown:
        raise SystemExit(f"unknown topology {unknown[0]!r}; valid: {', '.join(table)}")
    return [table[n] for n in names.split(",")]


# --- memory: what one rank holds ----------------------------------------------------------------------------
def _is_routed_or_shared_expert(name: str) -> bool:
    return ".experts." in name or ".shared_experts." in name


def rank_weight_bytes(config: Any, info: Any) -> dict[str, int]:
    """Bytes rank ``info`` holds once built, from its slices' shapes (meta tensors, nothing allocated): routed
    and shared experts stay FP8 (+ scales), other FP8 linears are dequantised to bf16 at load; per part.

    The decoder layers after the dense ones are alike, so a deep model is counted from two shallow ones
    (``first_k_dense_replace`` + 1 and + 2 layers): the second adds one MoE layer's bytes, which the other layers
    repeat. Exactly the full count (``tests/test_bench_full_size.py``), in seconds instead of a minute at 61."""
    first = config.first_k_dense_replace + 1
    if config.num_hidden_layers <= first + 1:
        return _counted_rank_weight_bytes(config, info)
    one = _counted_rank_weight_bytes(dataclasses.replace(config, num_hidden_layers=first), info)
    two = _counted_rank_weight_bytes(dataclasses.replace(config, num_hidden_layers=first + 1), info)
    return {k: one[k] + (two[k] - one[k]) * (config.num_hidden_layers - first) for k in one}


def _counted_rank_weight_bytes(config: Any, info: Any) -> dict[str, int]:
    from dsa_runtime.distributed.sharding import SCALE_SUFFIX, Reader, is_mtp, shard_state
    from dsa_runtime.loader.spec import expected_tensors

    specs = {n: s for n, s in expected_tensors(config, fp8=True).items() if not is_mtp(n, config.num_hidden_layers)}
    dtypes = {"fp8": torch.float8_e4m3fn, "fp32": torch.float32, "bf16": torch.bfloat16, "norm": torch.bfloat16}

    def read(name: str, dim: int | None, start: int, end: int) -> torch.Tensor:
        shape = list(specs[name].shape)
        if dim is not None:
            shape[dim] = end - start
        return torch.empty(shape, dtype=dtypes[specs[name].kind], device="meta")

    reader = Reader(list(specs), lambda n: tuple(specs[n].shape), lambda n: specs[n].kind == "fp8", read)
    parts = {"routed_experts": 0, "other": 0}
    for name, t in shard_state(reader, info, config.num_hidden_layers).items():
        if name.endswith(SCALE_SUFFIX):
            keep = _is_routed_or_shared_expert(name)
            nbytes = t.numel() * 4 if keep else 0
        elif t.dtype == torch.float8_e4m3fn:
            nbytes = t.numel() * (1 if _is_routed_or_shared_expert(name) else 2)
        else:
            nbytes = t.numel() * t.element_size()
        parts["routed_experts" if ".mlp.experts." in name else "other"] += nbytes
    parts["total"] = parts["routed_experts"] + parts["other"]
    return parts


def max_rank_bytes(config: Any, topo: Topology) -> int:
    par = topo.parallel(60.0)
    return max(rank_weight_bytes(config, par.rank_info(r))["total"] for r in range(topo.tp))


def plan_kv(config: Any, args: argparse.Namespace, *, tokens: int | None = None, budget: int | None = None) -> Any:
    """``cache.plan_capacity`` for the load: KV pages for ``tokens`` or within ``budget`` bytes, after the step
    workspaces (the indexer logits of a prefill chunk over the longest context dominate them)."""
    from dsa_runtime.cache import plan_capacity

    return plan_capacity(config, args.page_size, "fp8_656", budget_bytes=budget, max_total_tokens=tokens,
                         chunked_prefill_size=args.chunked_prefill_size, max_running=max(args.requests, 1),
                         dtype=torch.bfloat16, max_context=args.input_len + args.output_len + 16)


def auto_layers(args: argparse.Namespace, topos: list[Topology], budget: int, kv_tokens: int) -> int:
    """The most layers (>= dense + 1) whose weights, step workspaces and ``kv_tokens`` of KV fit ``budget`` bytes
    on every rank of every topology."""

    def need(layers: int) -> int:
        cfg = model_config(args.model, layers, args.dense)
        plan = plan_kv(cfg, args, tokens=kv_tokens)
        return max(max_rank_bytes(cfg, t) for t in topos) + plan.cache_bytes + plan.workspace_bytes

    small, big = need(args.dense + 1), need(args.dense + 2)
    layers = args.dense + 1 + max(0, (budget - small) // (big - small))
    while layers > args.dense + 1 and need(layers) > budget:
        layers -= 1
    if need(layers) > budget:
        raise SystemExit(f"even {layers} layers need {need(layers) / GIB:.1f} GiB per rank, over the "
                         f"{budget / GIB:.1f} GiB budget")
    return int(min(layers, 61))


# --- the roofline ------------------------------------------------------------------------------------------
def decode_roofline(config: Any, topo: Topology, batch: int, context: int, experts_touched: float,
                    copy_gbs: float) -> dict[str, float]:
    """A full-batch decode step's bytes on the busiest rank, and their time at ``copy_gbs`` (GB/s, read+write
    counted as by ``common.copy_ceiling_gbs``; a read-only stream runs at about that figure)."""
    from dsa_runtime.cache.kv_cache import mla_bytes_per_token
    from dsa_runtime.families import INDEX_K_ROW_BYTES

    par = topo.parallel(60.0)
    info = par.rank_info(0)
    parts = rank_weight_bytes(config, info)
    moe_layers = config.num_hidden_layers - config.first_k_dense_replace
    # Without EP a rank holds a slice of every expert; with EP whole experts, E / ep of them (uniform routing
    # spreads the touched experts evenly over the EP ranks).
    held = config.n_routed_experts // topo.ep
    per_expert = parts["routed_experts"] / max(1, moe_layers * held)
    weights = parts["other"] + moe_layers * experts_touched / topo.ep * per_expert
    per_rank_batch = batch // topo.dp if topo.dp > 1 else batch
    k = min(context, config.index_topk or context)
    kv = config.num_hidden_layers * per_rank_batch * (context * INDEX_K_ROW_BYTES + k * mla_bytes_per_token("fp8_656"))
    total = weights + kv
    return {"weight_bytes": weights, "kv_bytes": kv, "bytes": total, "copy_gbs": copy_gbs,
            "roofline_ms": total / (copy_gbs * 1e9) * 1e3 if copy_gbs else float("nan")}


def uniform_touched(tokens: int, experts: int, top_k: int) -> float:
    """Expected distinct experts ``tokens`` tokens choose when each picks ``top_k`` of ``experts`` uniformly."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def checkpoint_bytes(config: Any) -> int:
    """Bytes of the whole FP8 checkpoint of ``config`` (main stack), as stored."""
    from dsa_runtime.distributed.sharding import is_mtp
    from dsa_runtime.loader.spec import expected_tensors

    size = {"fp8": 1, "fp32": 4, "bf16": 2, "norm": 2}
    return sum(math.prod(s.shape) * size[s.kind] for n, s in expected_tensors(config, fp8=True).items()
               if not is_mtp(n, config.num_hidden_layers))


def plan_only(args: argparse.Namespace) -> int:
    """What a run of these flags would hold per rank, from shapes alone: for checking a command before the
    machine it needs is lent."""
    if args.gpu_memory_gib is None:
        if not torch.cuda.is_available():
            print("bench/full_size.py: --plan-only needs --gpu-memory-gib without a GPU", file=sys.stderr)
            return 2
        args.gpu_memory_gib = torch.cuda.get_device_properties(0).total_memory / GIB
    topos = topologies(args.gpus, args.topologies)
    load_tokens = args.requests * (args.input_len + args.output_len) + 2 * (args.input_len + 8)
    budget = int(args.gpu_memory_gib * GIB * args.mem_fraction_static - args.headroom_gib * GIB)
    layers = auto_layers(args, topos, budget, load_tokens) if args.layers == "auto" else int(args.layers)
    config = model_config(args.model, layers, args.dense)
    print(f"{args.gpus} GPUs of {args.gpu_memory_gib:.1f} GiB, --mem-fraction-static {args.mem_fraction_static}, "
          f"headroom {args.headroom_gib} GiB: {layers} layers, {checkpoint_bytes(config) / 1e9:.0f} GB of FP8 weights")
    ok = True
    print("| topology | weights / rank (GiB) | routed experts / rank | experts held | workspaces (GiB) "
          "| KV tokens / rank | KV tokens, dp groups x rank | load |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for topo in topos:
        parts = max((rank_weight_bytes(config, topo.parallel(60.0).rank_info(r)) for r in range(topo.tp)),
                    key=lambda p: p["total"])
        weights = parts["total"]
        try:
            plan = plan_kv(config, args, budget=budget - weights)
            tokens, ws = plan.max_total_tokens, plan.workspace_bytes
        except ValueError:
            tokens, ws = 0, float("nan")
        fits = tokens >= load_tokens
        ok &= fits
        held = (f"{config.n_routed_experts // topo.ep} whole" if topo.ep > 1
                else f"1/{topo.tp} of {config.n_routed_experts}")
        print(f"| {topo.name} | {weights / GIB:.1f} | {parts['routed_experts'] / GIB:.1f} | {held} | {ws / GIB:.1f} "
              f"| {tokens} | {tokens * topo.dp} | needs {load_tokens}: {'fits' if fits else 'DOES NOT FIT'} |")
    print("KV tokens / rank: the MLA latent is not split by heads, so a TP rank holds every token's row and a DP "
          "group's ranks only their requests'. dp groups x rank: what per-group page allocators would admit; the "
          "engine's one allocator admits KV tokens / rank in all today (docs/distributed.md, DP attention)")
    return 0 if ok else 2
