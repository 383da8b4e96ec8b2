"""ModelRunner: the engine's only view of the model (``plan/INTERFACES.md``).

``forward(ForwardBatch)`` runs one step over a mix of prefill chunks and decodes: it writes every new
token's MLA row and index-K row into the paged cache at its slot (every layer), then returns float32 logits
per sequence as asked (``"last"`` ``[vocab]``, ``"all"`` ``[len, vocab]``, ``"none"`` None).

Model dtype: bfloat16 (default) or float32. With float32 the kernels receive float32 activations; the
``reference`` backend computes in fp32 either way, GPU kernels need bfloat16, so float32 is a CPU /
verification mode. Kernel outputs (sparse attention, MoE) are bf16 by contract in both modes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from dsa_runtime.model.attention import AttnContext, DecodeTables
from dsa_runtime.model.batch import ForwardBatch, ForwardSeq, StepMeta, build_step
from dsa_runtime.model.config import ModelConfig
from dsa_runtime.model.decode_graph import DecodeGraphs
from dsa_runtime.model.decode_state import DecodePlan, RequestSlots, decode_inputs
from dsa_runtime.model.deepseek import DeepseekModel

if TYPE_CHECKING:
    from dsa_runtime.cache.kv_cache import KVCache

logger = logging.getLogger(__name__)

__all__ = ["ForwardBatch", "ForwardSeq", "ModelRunner", "kernel_needs"]

DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32}


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"unknown model dtype {dtype!r}; valid: bfloat16, float32")
        return DTYPES[dtype]
    if dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"model dtype must be bfloat16 or float32, got {dtype}")
    return dtype


def kernel_needs(config: ModelConfig, page_size: int, *, fp8_experts: bool | None = None,
                 attn_tp: int = 1) -> dict[str, object]:
    """What this model asks of the kernels, for ``resolve_kernels(..., needs=...)``.

    heads (MLA query heads), page_size, decode_queries (1: no MTP drafting), weight_dtype of the routed
    experts (``fp8_e4m3`` when the checkpoint is FP8), and for DSA index_heads, k (``index_topk``: every
    index tensor the runner passes is exactly this wide) and the indexer's scale_fmt.
    """
    fp8 = config.quantization is not None if fp8_experts is None else fp8_experts
    needs: dict[str, object] = {
        "heads": config.num_attention_heads // attn_tp,  # per rank under tensor parallelism
        "page_size": page_size,
        "decode_queries": 1,
        "weight_dtype": "fp8_e4m3" if fp8 else "bf16",
    }
    if config.is_dsa:
        needs.update(index_heads=config.index_n_heads, k=config.index_topk,
                     scale_fmt="ue8m0" if config.scale_fmt == "ue8m0" else "float")
    return needs


class ModelRunner:
    """Runs the DeepSeek model over a paged :class:`~dsa_runtime.cache.KVCache`.

    Args:
        config: the model's :class:`ModelConfig`.
        tensors: HF-named checkpoint tensors (FP8 weights as e4m3 + ``*_scale_inv``); the MTP layer's
            tensors may be included (kept aside) or omitted.
        kernels: :class:`~dsa_runtime.resolve.ResolvedKernels`; every kernel call goes through it.
        cache: the KV cache the runner writes and reads (its ``kv_layout`` is the attention layout).
        dtype: ``torch.bfloat16`` (default) or ``torch.float32`` (or their names).
        device: defaults to the cache's device.
        mha_max_keys: dense prefill chunks with at most this many keys use MHA (default 2048, SGLang's
            dense-prefill threshold; 0 disables MHA). For DSA it is also capped at ``index_topk``.
        indexer_budget_bytes: most bytes of indexer logits + top-k workspace per prefill row chunk (default:
            256 MiB on CPU, a quarter of free memory on CUDA, at most 4 GiB).
        tp: this rank's :class:`~dsa_runtime.distributed.comm.TPContext` when ``tensors`` are one rank's
            slices (``dsa_runtime.distributed.sharding``); None on one process.
        moe_fp32_sum: bf16 models: the MoE keeps each expert's output in fp32 and rounds the sum once, the
            rounding TP ranks get from their fp32 partial sums (``--tp-reduce-dtype fp32``), so tp 1 and
            tp N agree up to fp32 summation order. Off by default: on CPU it costs an fp32 down-projection
            GEMM per expert (tiny-v32 prefill ~20% slower); on GPUs an fp32 per-pair buffer.
    """

    def __init__(
        self,
        config: ModelConfig,
        tensors: dict[str, Tensor],
        *,
        kernels,
        cache: KVCache,
        dtype: torch.dtype | str = torch.bfloat16,
        device: torch.device | str | None = None,
        mha_max_keys: int = 2048,
        tp=None,
        indexer_budget_bytes: int | None = None,
        moe_fp32_sum: bool = False,
    ) -> None:
        self.config = config
        self.kernels = kernels
        self.cache = cache
        self.dtype = _as_dtype(dtype)
        self.device = torch.device(device) if device is not None else cache.device
        if cache.config.num_hidden_layers != config.num_hidden_layers or cache.config.is_dsa != config.is_dsa:
            raise ValueError("the KV cache was built for a different model config")
        self.mha_max_keys = mha_max_keys
        self.tp = tp
        self.indexer_budget_bytes = indexer_budget_bytes
        self.moe_fp32_sum = moe_fp32_sum
        with torch.inference_mode():
            self.model = DeepseekModel(config, tensors, dtype=self.dtype, device=self.device, tp=tp,
                                       moe_fp32_sum=moe_fp32_sum)
        self.request_slots: RequestSlots | None = None  # GPU-resident decode state (setup_decode)
        self.graphs: DecodeGraphs | None = None

    @classmethod
    def from_checkpoint(cls, checkpoint, **kwargs) -> ModelRunner:
        """Build from a loader ``Checkpoint`` (``.config``, ``.tensors``, ``.mtp_tensors``)."""
        tensors = dict(checkpoint.tensors)
        tensors.update(getattr(checkpoint, "mtp_tensors", {}) or {})
        return cls(checkpoint.config, tensors, **kwargs)

    def load_weights(self, tensors: dict[str, Tensor]) -> None:
        """Replace every weight from a new HF-named tensor dict (same config); the cache is kept."""
        with torch.inference_mode():
            self.model = DeepseekModel(self.config, tensors, dtype=self.dtype, device=self.device, tp=self.tp,
                                       moe_fp32_sum=self.moe_fp32_sum)

    @property
    def mtp_tensors(self) -> dict[str, Tensor]:
        return self.model.mtp_tensors

    def _context(self, step: StepMeta) -> AttnContext:
        cfg = self.config
        mha = self.mha_max_keys
        if cfg.is_dsa:
            mha = min(mha, cfg.index_topk)
        return AttnContext(
            kernels=self.kernels,
            step=step,
            kv_layout=self.cache.kv_layout,
            sm_scale=cfg.softmax_scale,
            index_topk=cfg.index_topk if cfg.is_dsa else None,
            mha_max_keys=mha,
            index_scale_fmt="ue8m0" if cfg.scale_fmt == "ue8m0" else "float",
            index_budget_bytes=self.indexer_budget_bytes,
            # CPU only: GPU kernels are the point of the absorbed sparse path (and at V3.2's 128 heads and
            # index_topk 2048 the dense cap above already covers every chunk this could take).
            sparse_mha_max_keys=self.mha_max_keys if cfg.is_dsa and self.device.type == "cpu" else 0,
        )

    # --- pure decode steps from GPU-resident state ------------------------------------------------------------
    def setup_decode(self, max_requests: int, max_model_len: int, graph_batch_sizes: list[int] | None = None,
                     progress: bool = True) -> None:
        """Allocate the request slots' block tables and, given batch sizes on CUDA, capture decode graphs.

        A capture that fails (a kernel that reads the device from the host, say) is logged with its reason
        and decode runs eagerly.
        """
        ps = self.cache.page_size
        self.request_slots = RequestSlots(max_requests, -(-max_model_len // ps), self.device)
        self.graphs = None
        if not graph_batch_sizes or self.device.type != "cuda" or self.tp is not None:
            return
        pages = self.request_slots.max_pages
        graphs = DecodeGraphs(lambda rows: self._decode_eager(rows, pages), graph_batch_sizes,
                              self.request_slots.null_slot, self.device)
        try:
            graphs.capture(progress=progress)
        except Exception as exc:  # a backend that cannot be captured: eager decode, said once
            logger.warning(
                "CUDA-graph capture failed (%s: %s); decode runs eagerly (--disable-cuda-graph silences this)",
                type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
            torch.cuda.synchronize(self.device)
            return
        self.graphs = graphs

    def decode(self, plan: DecodePlan) -> Tensor:
        """Logits ``[B, vocab]`` fp32 of a pure decode step (every row one token, at its plan position).

        Needs :meth:`setup_decode` and the rows' slots synced (:meth:`RequestSlots.sync`). Replays a CUDA
        graph when one covers B (the returned tensor is then the graph's static output: use it before the
        next step), else runs the same code eagerly over just the pages the longest row needs.
        """
        if self.request_slots is None:
            raise RuntimeError("ModelRunner.decode needs setup_decode() first")
        rows = plan.rows.to(self.device, non_blocking=True)
        if self.graphs is not None and plan.batch_size <= self.graphs.max_bs:
            return self.graphs.run(rows)
        return self._decode_eager(rows, min(-(-plan.longest // self.cache.page_size), self.request_slots.max_pages))

    def _decode_eager(self, rows: Tensor, pages: int) -> Tensor:
        """The decode forward over plan rows ``[3, B]`` on the device and ``pages`` block-table columns."""
        cache = self.cache
        slots = self.request_slots
        ids, pos, kv_slots, lens, table = decode_inputs(rows, slots.block_table, cache.page_size, pages, slots.next_ids)
        batch = ids.shape[0]
        step = StepMeta(seqs=[], token_ids=ids, positions=pos, slots=kv_slots, page_size=cache.page_size)
        ctx = self._context(step)
        ctx.decode = DecodeTables(
            lens=lens, table=table, rows=torch.arange(batch, dtype=torch.int32, device=self.device),
            starts=torch.zeros(batch, dtype=torch.int32, device=self.device), width=pages * cache.page_size,
        )
        with torch.inference_mode():
            return self.model.logits(self.model.hidden_states(ctx, cache.mla, cache.index_k))

    def forward(self, batch: ForwardBatch) -> list[Tensor | None]:
        """One step; see the module docstring. Raises ``ValueError`` for malformed batches (nothing written)."""
        cache = self.cache
        step = build_step(batch, page_size=cache.page_size, num_pages=cache.num_pages,
                          vocab_size=self.config.vocab_size, device=self.device)
        with torch.inference_mode():
            hidden = self.model.hidden_states(self._context(step), cache.mla, cache.index_k)
            rows: list[int] = []
            spans: list[tuple[int, int] | None] = []
            for seq, meta in zip(batch.seqs, step.seqs, strict=True):
                if seq.logits == "none":
                    spans.append(None)
                    continue
                picked = [meta.t1 - 1] if seq.logits == "last" else list(range(meta.t0, meta.t1))
                spans.append((len(rows), len(rows) + len(picked)))
                rows.extend(picked)
            logits = self.model.logits(hidden[torch.tensor(rows, device=self.device)]) if rows else None
        out: list[Tensor | None] = []
        for seq, span in zip(batch.seqs, spans, strict=True):
            if span is None:
                out.append(None)
            elif seq.logits == "last":
                out.append(logits[span[0]])
            else:
                out.append(logits[span[0]:span[1]])
        return out
