"""Build an engine's parts from an :class:`EngineConfig`: checkpoint, kernels, cache plan, cache, runner.

Order: load the checkpoint (the embedded tiny V3.2 model when ``model`` is None), resolve the kernel
families, then size the KV cache: ``--max-total-tokens`` when given; on a GPU ``--mem-fraction-static`` of the
memory free after the weights are loaded (the step workspaces, indexer logits of the largest prefill chunk
included, are subtracted first); on a CPU, where "free memory" means nothing useful, ``CPU_DEFAULT_TOKENS``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsa_runtime.engine.config import EngineConfig
from dsa_runtime.engine.parts import EngineParts, eos_token_ids

if TYPE_CHECKING:
    from dsa_runtime.loader.tokenizer import Tokenizer

logger = logging.getLogger(__name__)
CPU_DEFAULT_TOKENS = 32768
# Models this narrow run on one CPU thread unless --cpu-threads says otherwise: their matmuls are too small
# to split, and with two threads on cores that other processes keep busy, OpenMP spin-waits made steps 10-50x
# slower (measured: decode step at batch 8, 14 ms on one thread vs 1.15 s on two; idle, two threads are at
# best 1.6x faster, on a 2048-token prefill).
TINY_HIDDEN = 1024


def build_parts(config: EngineConfig) -> EngineParts:
    """Load ``config.model`` (or the embedded default) and assemble everything the engine runs on."""
    from dsa_runtime.loader import default_model_path, load_checkpoint

    path = Path(config.model) if config.model else default_model_path()
    if config.tp > 1 or config.distributed_executor_backend == "mp":
        from dsa_runtime.distributed.engine_build import build_distributed_parts, run_worker_node

        if config.node_rank > 0:  # this node only runs ranks; node 0 owns the scheduler
            raise SystemExit(run_worker_node(config, path))
        return build_distributed_parts(config, path, _eos_ids(path))
    from dsa_runtime.loader.overrides import override_config

    checkpoint = load_checkpoint(path, device="cpu", progress=True)
    model_config = override_config(checkpoint.config, checkpoint.raw_config, config.model_overrides())
    parts = build_parts_from_weights(
        config, model_config, checkpoint.all_tensors(), checkpoint.tokenizer, _eos_ids(path)
    )
    parts.model_path = str(path)
    return parts


def _eos_ids(path: Path) -> set[int]:
    """``generation_config.json``'s ``eos_token_id`` (an int or a list) when the checkpoint has one."""
    gen = path / "generation_config.json"
    if not gen.is_file():
        return set()
    try:
        value = json.loads(gen.read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, ValueError, AttributeError):
        return set()
    values = value if isinstance(value, list) else [value]
    return {v for v in values if isinstance(v, int)}


def build_parts_from_weights(
    config: EngineConfig,
    model_config: Any,
    tensors: dict[str, Any],
    tokenizer: Tokenizer | None,
    extra_eos: set[int] | None = None,
) -> EngineParts:
    """Assemble parts from an in-memory model (HF-named tensors) and its tokenizer (None: token ids only)."""
    import torch

    from dsa_runtime.cache import KVCache, PageAllocator, device_budget_bytes, plan_capacity
    from dsa_runtime.model.runner import ModelRunner, kernel_needs
    from dsa_runtime.resolve import resolve_kernels

    draft_layers = 1 if config.speculative else 0
    if draft_layers:
        mtp_prefix = f"model.layers.{model_config.num_hidden_layers}."
        config.check_draft_model(model_config, any(k.startswith(mtp_prefix) for k in tensors))
    # A verify's tokens are decode rows of their own (each its own query and length), so MTP asks the decode
    # kernels for nothing more than one query per row.
    needs = kernel_needs(model_config, config.page_size or 1)
    if config.page_size is None:
        needs.pop("page_size")  # checked against the platform's default page size by the resolver
    kernels = resolve_kernels(config.kernel_config(), needs=needs)
    device = torch.device(kernels.device)
    if device.type == "cpu":
        threads = config.cpu_threads or (1 if model_config.hidden_size <= TINY_HIDDEN else None)
        if threads:
            torch.set_num_threads(threads)
    dtype = getattr(torch, config.dtype)
    page_size = config.page_size or kernels.defaults.page_size
    max_context = min(
        config.max_model_len or model_config.max_position_embeddings, model_config.max_position_embeddings
    )
    plan_args = {
        "config": model_config,
        "page_size": page_size,
        "kv_layout": kernels.kv_layout,
        "chunked_prefill_size": config.chunked_prefill_size,
        "max_running": config.max_running_requests,
        "dtype": dtype,
        "max_context": max_context,
        # The decode graphs' memory pool is set aside like a workspace (they are captured on CUDA only).
        "graph_max_bs": max(config.graph_row_sizes(), default=0) if device.type == "cuda" else 0,
        "draft_layers": draft_layers,
    }
    # One slot beyond --max-running-requests: Engine.score runs beside a full batch.
    runner_args = {"kernels": kernels, "dtype": dtype, "device": device, "nextn": bool(draft_layers),
                   "max_requests": config.max_running_requests + 1, "max_model_len": max_context,
                   "draft_steps": config.speculative_num_steps or 1}
    if config.max_total_tokens is None and device.type == "cuda":
        # Weights first, so the budget is what is left; then the cache.
        runner = _runner_without_cache(model_config, tensors, runner_args)
        plan = plan_capacity(
            **plan_args, budget_bytes=device_budget_bytes(device, config.mem_fraction_static)
        )
        runner.cache = KVCache(model_config, plan.num_pages, page_size, kernels.kv_layout, device, dtype,
                               draft_layers=draft_layers)
        runner.setup(runner_args["max_requests"], max_context, runner_args["draft_steps"])  # the real page size
    else:
        tokens = config.max_total_tokens or CPU_DEFAULT_TOKENS
        plan = plan_capacity(**plan_args, max_total_tokens=tokens)
        cache = KVCache(model_config, plan.num_pages, page_size, kernels.kv_layout, device, dtype,
                        draft_layers=draft_layers)
        runner = ModelRunner(model_config, tensors, cache=cache, **runner_args)
    runner.capture_graphs(config.graph_row_sizes(), chain_batch_sizes=config.graph_batch_sizes())
    if runner.graphs:
        logger.info("CUDA graphs: %.1f MiB measured, %.1f MiB set aside by the memory planner",
                    sum(g.capture_bytes for g in runner.graphs.values()) / 2**20,
                    plan.workspace.get("cuda_graphs", 0) / 2**20)
    logger.info(
        "KV cache: %d pages x %d tokens (%s), %.1f MiB; workspace %.1f MiB",
        plan.num_pages, page_size, kernels.kv_layout, plan.cache_bytes / 2**20, plan.workspace_bytes / 2**20,
    )  # fmt: skip
    return EngineParts(
        runner=runner,
        tokenizer=tokenizer,
        allocator=PageAllocator(plan.num_pages),
        page_size=page_size,
        max_model_len=max_context,
        vocab_size=model_config.vocab_size,
        eos_token_ids=eos_token_ids(model_config, tokenizer, extra_eos),
        model_config=model_config,
        kernels=kernels,
    )


def _runner_without_cache(model_config: Any, tensors: dict[str, Any], runner_args: dict[str, Any]) -> Any:
    """A runner on a 2-page placeholder cache (weights loaded); the real cache is attached once sized."""
    from dsa_runtime.cache import KVCache
    from dsa_runtime.model.runner import ModelRunner

    placeholder = KVCache(model_config, 2, 1, runner_args["kernels"].kv_layout, runner_args["device"],
                          draft_layers=int(runner_args["nextn"]))
    return ModelRunner(model_config, tensors, cache=placeholder, **{**runner_args, "max_model_len": 2})
