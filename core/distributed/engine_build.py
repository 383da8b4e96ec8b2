"""Engine parts for ``--tp N`` (``--dp D --enable-dp-attention``): rank 0 here, the other ranks spawned.

Rank 0 reads the config from the checkpoint's headers and the tokenizer, never the whole checkpoint: every
rank (rank 0 included) reads only its slices. The KV cache is sized by ``--max-total-tokens`` (default 32768
tokens) and every rank holds one with the same page ids; under DP attention each group writes only its
own requests' rows (see ``docs/distributed.md``). ``--node-rank`` > 0 runs this node's ranks and returns
their exit code instead (:func:`run_worker_node`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)
DEFAULT_TOKENS = 32768


def _spec(config: Any, path: Path, kernels: Any, num_pages: int, page_size: int, hidden: int,
          max_context: int) -> Any:
    from dsa_runtime.distributed.worker import RankSpec

    device_type = "cuda" if str(kernels.device).startswith("cuda") else "cpu"
    if device_type == "cuda":
        import torch

        need, have = config.parallel().ranks_per_node, torch.cuda.device_count()
        if have < need:
            from dsa_runtime.errors import ConfigError

            raise ConfigError(
                f"--tp {config.tp} needs {need} GPUs on this node (one per rank), torch sees {have}; "
                "lower --tp, add --nnodes, or run on the CPU with --device cpu"
            )
    threads = config.cpu_threads or (1 if hidden <= 1024 else None)
    cuda = device_type == "cuda"
    return RankSpec(model_path=str(path), dtype=config.dtype, device_type=device_type,
                    kernel_config=config.kernel_config(), num_pages=num_pages, page_size=page_size,
                    cpu_threads=None if cuda else threads, nextn=config.speculative,
                    config_overrides=config.model_overrides(),
                    # One slot beyond --max-running-requests: Engine.score runs beside a full batch.
                    max_requests=config.max_running_requests + 1, max_model_len=max_context,
                    draft_steps=config.speculative_num_steps or 1,
                    graph_batch_sizes=config.graph_row_sizes() if cuda else [],
                    chain_batch_sizes=config.graph_batch_sizes() if cuda else None)


def _kernels(config: Any, model_config: Any) -> Any:
    from dsa_runtime.errors import ConfigError
    from dsa_runtime.model.runner import kernel_needs
    from dsa_runtime.resolve import resolve_kernels

    parallel = config.parallel()
    try:
        parallel.check_model(model_config.num_attention_heads, model_config.intermediate_size,
                             model_config.moe_intermediate_size if model_config.n_routed_experts else None,
                             model_config.n_routed_experts or 0)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    needs = kernel_needs(model_config, config.page_size or 1, attn_tp=parallel.attn_size)
    if config.page_size is None:
        needs.pop("page_size")
    return resolve_kernels(config.kernel_config(), needs=needs)


def run_worker_node(config: Any, path: Path) -> int:
    """``--node-rank`` > 0: run this node's ranks until node 0 stops them."""
    from dsa_runtime.distributed.worker import serve_worker_node
    from dsa_runtime.loader.overrides import override_config
    from dsa_runtime.loader.validate import inspect_layout

    layout = inspect_layout(path)
    model_config = override_config(layout.config, layout.raw_config, config.model_overrides())
    kernels = _kernels(config, model_config)
    page_size = config.page_size or kernels.defaults.page_size
    num_pages = _num_pages(config, model_config, kernels, page_size)
    spec = _spec(config, path, kernels, num_pages, page_size, model_config.hidden_size, _max_context(config, model_config))
    return serve_worker_node(config.parallel(), spec)


def _max_context(config: Any, model_config: Any) -> int:
    return min(config.max_model_len or model_config.max_position_embeddings, model_config.max_position_embeddings)


def _num_pages(config: Any, model_config: Any, kernels: Any, page_size: int) -> int:
    import torch

    from dsa_runtime.cache import plan_capacity

    plan = plan_capacity(config=model_config, page_size=page_size, kv_layout=kernels.kv_layout,
                         chunked_prefill_size=config.chunked_prefill_size, max_running=config.max_running_requests,
                         dtype=getattr(torch, config.dtype), max_context=model_config.max_position_embeddings,
                         max_total_tokens=config.max_total_tokens or DEFAULT_TOKENS,
                         draft_layers=1 if config.speculative else 0)
    return plan.num_pages


def build_distributed_parts(config: Any, path: Path, extra_eos: set[int]) -> Any:
    """EngineParts whose runner is a :class:`~dsa_runtime.distributed.runtime.DistributedRunner`."""
    from dsa_runtime.cache import PageAllocator
    from dsa_runtime.distributed.runtime import DistributedRunner
    from dsa_runtime.engine.parts import EngineParts, eos_token_ids
    from dsa_runtime.loader.overrides import override_config
    from dsa_runtime.loader.tokenizer import load_tokenizer
    from dsa_runtime.loader.validate import inspect_layout

    layout = inspect_layout(path)
    model_config = override_config(layout.config, layout.raw_config, config.model_overrides())
    config.check_draft_model(model_config, layout.has_mtp)
    kernels = _kernels(config, model_config)
    page_size = config.page_size or kernels.defaults.page_size
    num_pages = _num_pages(config, model_config, kernels, page_size)
    parallel = config.parallel()
    max_context = _max_context(config, model_config)
    spec = _spec(config, path, kernels, num_pages, page_size, model_config.hidden_size, max_context)
    logger.info("tensor parallel: tp %d, dp %d (%d ranks per attention group), ep %d, %d node(s); KV %d pages x %d",
                parallel.tp, parallel.dp, parallel.attn_size, parallel.ep, parallel.nnodes, num_pages, page_size)
    runner = DistributedRunner(parallel, spec)
    ep_load = None
    if parallel.ep > 1:
        from dsa_runtime.distributed.ep_load import EPLoad

        ep_load = EPLoad(runner)
    tokenizer = load_tokenizer(layout.folder) if (layout.folder / "tokenizer.json").is_file() else None
    return EngineParts(
        runner=runner, tokenizer=tokenizer, allocator=PageAllocator(num_pages), page_size=page_size,
        max_model_len=max_context, vocab_size=model_config.vocab_size,
        eos_token_ids=eos_token_ids(model_config, tokenizer, extra_eos), model_config=model_config,
        model_path=str(path), kernels=runner.kernels, ep_load=ep_load,
    )
