"""Per-layer paged pools: the MLA latent cache and (V3.2) the lightning indexer's key cache.

Layouts follow ``dsa_runtime.families``: MLA ``bf16`` ``[pages, page_size, 576]`` bf16 or ``fp8_656``
``[pages, page_size, 656]`` uint8, index-K ``[pages, page_size * 132]`` uint8. A token at request position
``p`` lives at slot ``page_table[p // page_size] * page_size + p % page_size`` in every layer's pools.
The main stack's layers come first; ``draft_layers`` extra pools (MTP speculative decoding: the NextN layer)
follow them, written and read at the same slots, so one page table serves the target and the draft.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsa_runtime.families import D_QK, FP8_MLA_ROW_BYTES, INDEX_K_ROW_BYTES, MLA_LAYOUTS

if TYPE_CHECKING:
    import torch

    from dsa_runtime.model.config import ModelConfig


def mla_bytes_per_token(kv_layout: str) -> int:
    """Bytes of one MLA row of one layer: 1152 (``bf16``, 576 x 2) or 656 (``fp8_656``)."""
    if kv_layout == "bf16":
        return D_QK * 2
    if kv_layout == "fp8_656":
        return FP8_MLA_ROW_BYTES
    raise ValueError(f"unknown KV layout {kv_layout!r}; valid: {', '.join(MLA_LAYOUTS)}")


class KVCache:
    """The paged caches of every main-stack layer.

    Attributes:
        mla: ``num_hidden_layers + draft_layers`` tensors ``[num_pages, page_size, 576]`` bf16 or ``[..., 656]`` uint8.
        index_k: (DSA only, else empty) tensors ``[num_pages, page_size * 132]`` uint8.
        kv_layout, page_size, num_pages, device, draft_layers (pools past the main stack: ``mla[n:]``).

    ``dtype`` is the model's dtype, kept for callers; the pools' dtypes are fixed by the layouts. Pools are
    zero-filled: stale bytes can then never decode as NaN/inf, and page 0 (reserved) stays finite.
    """

    def __init__(
        self,
        config: ModelConfig,
        num_pages: int,
        page_size: int,
        kv_layout: str = "bf16",
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        draft_layers: int = 0,
    ) -> None:
        import torch

        if kv_layout not in MLA_LAYOUTS:
            raise ValueError(f"unknown KV layout {kv_layout!r}; valid: {', '.join(MLA_LAYOUTS)}")
        if num_pages < 2 or page_size < 1:
            raise ValueError(f"need num_pages >= 2 and page_size >= 1, got {num_pages}, {page_size}")
        if config.kv_lora_rank + config.qk_rope_head_dim != D_QK:
            raise ValueError(
                f"the KV cache layouts need kv_lora_rank + qk_rope_head_dim = {D_QK}, got "
                f"{config.kv_lora_rank} + {config.qk_rope_head_dim}"
            )
        self.config = config
        self.num_pages = num_pages
        self.page_size = page_size
        self.kv_layout = kv_layout
        self.device = torch.device(device)
        self.dtype = dtype or torch.bfloat16
        if draft_layers < 0:
            raise ValueError(f"draft_layers must be >= 0, got {draft_layers}")
        self.draft_layers = draft_layers
        layers = config.num_hidden_layers + draft_layers
        if kv_layout == "bf16":
            shape, pool_dtype = (num_pages, page_size, D_QK), torch.bfloat16
        else:
            shape, pool_dtype = (num_pages, page_size, FP8_MLA_ROW_BYTES), torch.uint8
        self.mla: list[torch.Tensor] = [
            torch.zeros(shape, dtype=pool_dtype, device=self.device) for _ in range(layers)
        ]
        self.index_k: list[torch.Tensor] = []
        if config.is_dsa:
            self.index_k = [
                torch.zeros(num_pages, page_size * INDEX_K_ROW_BYTES, dtype=torch.uint8, device=self.device)
                for _ in range(layers)
            ]

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def bytes_per_token(self) -> int:
        """Cache bytes one token takes over all layers (MLA, plus index-K for DSA)."""
        per_layer = mla_bytes_per_token(self.kv_layout) + (INDEX_K_ROW_BYTES if self.config.is_dsa else 0)
        return per_layer * (self.config.num_hidden_layers + self.draft_layers)

    @property
    def total_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.mla, *self.index_k))

    def poison(self) -> None:
        """Fill every pool with 0xFF bytes (NaN as bf16 and e4m3): tests prove unwritten slots are never read."""
        import torch

        for t in (*self.mla, *self.index_k):
            t.view(torch.uint8).fill_(0xFF)
