"""Memory planner: how many KV pages fit in a budget once the largest step's workspaces are set aside.

The budget is either a token count (``--max-total-tokens``) or bytes: on GPUs a fraction of the free device
memory after the weights are loaded (SGLang's ``--mem-fraction-static``, :func:`device_budget_bytes`). The
workspace estimate counts what one scheduler step needs at its largest, because on V3.2 that, not the cache,
is what runs out first: the indexer's fp32 logits of the biggest prefill chunk over the longest context
(``chunk x max_context x 4`` bytes), the gathered bf16 KV and index keys of one prefill, the decode logits of
a full batch, the dense (MHA) prefill scores and the activations / output logits of the chunk. With CUDA graphs
(``graph_max_bs``) it also sets aside their private memory pool: every bucket is captured into one pool, so
it holds the intermediates of the largest bucket's decode forward (its activations, indexer logits over the
graph's static width, top-k indices and output logits), which eager steps cannot reuse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dsa_runtime.cache.kv_cache import mla_bytes_per_token
from dsa_runtime.families import D_QK, INDEX_HEAD_DIM, INDEX_K_ROW_BYTES

if TYPE_CHECKING:
    import torch

    from dsa_runtime.model.config import ModelConfig


@dataclass(frozen=True)
class CachePlan:
    """Result of :func:`plan_capacity`.

    Attributes:
        num_pages: pages to allocate, page 0 (reserved) included.
        max_total_tokens: tokens the usable pages hold, ``(num_pages - 1) * page_size``.
        mla_bytes_per_token / index_bytes_per_token: per token, summed over the main-stack (and draft) layers.
        bytes_per_token: their sum. cache_bytes: the pools' size (all ``num_pages``).
        workspace_bytes: the largest step's transient memory (sum of ``workspace``'s parts).
    """

    num_pages: int
    page_size: int
    kv_layout: str
    max_total_tokens: int
    mla_bytes_per_token: int
    index_bytes_per_token: int
    bytes_per_token: int
    cache_bytes: int
    workspace_bytes: int
    workspace: dict[str, int] = field(default_factory=dict)


def _dtype_bytes(dtype: torch.dtype | None) -> int:
    if dtype is None:
        return 2
    return dtype.itemsize


def estimate_workspace(
    config: ModelConfig,
    *,
    chunked_prefill_size: int,
    max_running: int,
    max_context: int,
    dense_prefill_max_keys: int = 2048,
    dtype: torch.dtype | None = None,
    graph_max_bs: int = 0,
) -> dict[str, int]:
    """Bytes of each transient buffer of the largest step (see the module docstring); a sum, not a peak.
    ``graph_max_bs``: rows of the largest CUDA-graph bucket (0: no graphs)."""
    act = _dtype_bytes(dtype)
    chunk = max(1, chunked_prefill_size)
    heads = config.num_attention_heads
    parts: dict[str, int] = {}
    if config.is_dsa:
        n_idx = config.index_n_heads or 0
        parts["indexer_prefill_logits"] = chunk * max_context * 4
        parts["indexer_decode_logits"] = max_running * max_context * 4
        parts["gathered_index_k"] = max_context * INDEX_K_ROW_BYTES
        parts["indexer_q"] = chunk * n_idx * (INDEX_HEAD_DIM * (4 + 1) + 4)
        parts["topk_indices"] = (chunk + max_running) * config.index_topk * 4  # type: ignore[operator]
    # One prefill's KV gathered and dequantised to bf16 [S, 576] for the sparse prefill kernel.
    parts["gathered_kv"] = max_context * D_QK * 2
    dense = min(dense_prefill_max_keys, max_context)
    if config.is_dsa:
        dense = min(dense, config.index_topk or dense)
    # Dense MHA prefill: per-head k_nope / v of every key, and fp32 scores of the chunk.
    parts["mha_kv"] = dense * heads * (config.qk_nope_head_dim + config.v_head_dim) * act
    parts["mha_scores"] = heads * min(chunk, dense) * dense * 4
    width = max(config.hidden_size, config.intermediate_size, 2 * config.moe_intermediate_size)
    row_activations = (
        4 * config.hidden_size + 2 * width + heads * (D_QK + config.qk_head_dim + config.v_head_dim)
    ) * max(act, 4)  # one token's activations through a layer
    parts["activations"] = chunk * row_activations
    parts["output_logits"] = chunk * config.vocab_size * 4
    if graph_max_bs > 0:
        row = row_activations + config.vocab_size * 4
        if config.is_dsa:
            row += max_context * 4 + config.index_topk * 4  # type: ignore[operator]
        parts["cuda_graphs"] = graph_max_bs * row
    return parts


def plan_capacity(
    config: ModelConfig,
    page_size: int,
    kv_layout: str,
    budget_bytes: int | None = None,
    max_total_tokens: int | None = None,
    chunked_prefill_size: int = 2048,
    max_running: int = 64,
    dtype: torch.dtype | None = None,
    max_context: int | None = None,
    dense_prefill_max_keys: int = 2048,
    graph_max_bs: int = 0,
    draft_layers: int = 0,
) -> CachePlan:
    """Size the KV pools from a token count or a byte budget.

    Exactly one of ``budget_bytes`` (workspaces are subtracted first) or ``max_total_tokens`` is given.
    ``max_context`` defaults to ``config.max_position_embeddings``. Raises ``ValueError`` with the numbers
    when the budget cannot hold the workspaces plus one usable page. ``draft_layers``: extra cache layers of an
    MTP draft model (speculative decoding), sized like main-stack layers.
    """
    if (budget_bytes is None) == (max_total_tokens is None):
        raise ValueError("give exactly one of budget_bytes or max_total_tokens")
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    layers = config.num_hidden_layers + draft_layers
    mla = mla_bytes_per_token(kv_layout) * layers
    index = INDEX_K_ROW_BYTES * layers if config.is_dsa else 0
    per_token = mla + index
    ctx = max_context or config.max_position_embeddings
    workspace = estimate_workspace(
        config,
        chunked_prefill_size=chunked_prefill_size,
        max_running=max_running,
        max_context=ctx,
        dense_prefill_max_keys=dense_prefill_max_keys,
        dtype=dtype,
        graph_max_bs=graph_max_bs,
    )
    ws = sum(workspace.values())
    if max_total_tokens is not None:
        if max_total_tokens < 1:
            raise ValueError(f"max_total_tokens must be >= 1, got {max_total_tokens}")
        num_pages = -(-max_total_tokens // page_size) + 1
    else:
        usable = budget_bytes - ws  # type: ignore[operator]
        num_pages = usable // (page_size * per_token)
        if num_pages < 2:
            raise ValueError(
                f"memory budget {budget_bytes / 2**20:.1f} MiB holds the step workspace "
                f"({ws / 2**20:.1f} MiB) but not one KV page of {page_size * per_token / 2**20:.2f} MiB; "
                "lower --chunked-prefill-size / --max-running-requests / the context length or raise the budget"
            )
    return CachePlan(
        num_pages=num_pages,
        page_size=page_size,
        kv_layout=kv_layout,
        max_total_tokens=(num_pages - 1) * page_size,
        mla_bytes_per_token=mla,
        index_bytes_per_token=index,
        bytes_per_token=per_token,
        cache_bytes=num_pages * page_size * per_token,
        workspace_bytes=ws,
        workspace=workspace,
    )


def device_budget_bytes(device: str | torch.device, mem_fraction_static: float) -> int:
    """Bytes for KV + workspaces on a GPU: ``mem_fraction_static`` of the memory free now (weights loaded).

    For CPU devices there is no reliable "free" figure; callers pass ``max_total_tokens`` instead.
    """
    import torch

    if not 0 < mem_fraction_static <= 1:
        raise ValueError(f"mem_fraction_static must be in (0, 1], got {mem_fraction_static}")
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"device_budget_bytes needs a CUDA device, got {dev}; give max_total_tokens")
    free, _total = torch.cuda.mem_get_info(dev)
    return int(free * mem_fraction_static)
