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
                 attn_tp: int = 1, decode_queries: int = 1) -> dict[str, object]:
    """What this model asks of the kernels, for ``resolve_kernels(..., needs=...)``.

    heads (MLA query heads), page_size, decode_queries (1: no MTP drafting; the tokens of one verify with it), weight_dtype of the routed
    experts (``fp8_e4m3`` when the checkpoint is FP8), and for DSA index_heads, k (``index_topk``: every
    index tensor the runner passes is exactly this wide) and the indexer's scale_fmt.
    """
    fp8 = config.quantization is not None if fp8_experts is None else fp8_experts
    needs: dict[str, object] = {
        "heads": config.num_attention_heads // attn_tp,  # per rank under tensor parallelism
        "page_size": page_size,
        "decode_queries": decode_queries,
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
        release_tensors: the runner takes ``tensors`` over and empties it, freeing each source tensor once its
            built form exists (build peak: the model plus one layer, not twice the model).
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
        nextn: bool = False,
        release_tensors: bool = False,
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
        self.nextn = nextn
        if nextn and cache.draft_layers < 1:
            raise ValueError("a runner with a NextN draft layer needs a KV cache with draft_layers >= 1")
        with torch.inference_mode():
            self.model = DeepseekModel(config, tensors, dtype=self.dtype, device=self.device, tp=tp,
                                       moe_fp32_sum=moe_fp32_sum, nextn=nextn, release_tensors=release_tensors)
        self.request_slots: RequestSlots | None = None  # GPU-resident decode state (setup_decode)
        self.graphs: DecodeGraphs | None = None
        self.draft_graphs: DecodeGraphs | None = None  # the NextN layer's, with nextn and graphs

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
                                       moe_fp32_sum=self.moe_fp32_sum, nextn=self.nextn)

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
                     progress: bool = True, draft_steps: int = 1, chain_batch_sizes: list[int] | None = None) -> None:
        """Allocate the request slots' block tables and, given batch sizes (rows) on CUDA, capture decode graphs
        (and, with a NextN layer, graphs of the same buckets for one draft step, and of ``chain_batch_sizes``,
        default the same, for a chain of ``draft_steps - 1`` steps, :meth:`draft_chain`).

        A capture that fails (a kernel that reads the device from the host, say) is logged with its reason
        and decode runs eagerly.
        """
        ps = self.cache.page_size
        self.request_slots = RequestSlots(max_requests, -(-max_model_len // ps), self.device)
        self.graphs = None
        self.draft_graphs = None
        self.chain_graphs = None
        self.draft_steps = draft_steps
        if not graph_batch_sizes or self.device.type != "cuda" or self.tp is not None:
            return
        pages = self.request_slots.max_pages
        null = self.request_slots.null_slot
        graphs = DecodeGraphs(lambda rows: self._decode_eager(rows, pages, hidden=self.nextn), graph_batch_sizes,
                              null, self.device)
        draft = chain = None
        if self.nextn:
            hidden = ((self.config.hidden_size,), self.dtype)
            draft = DecodeGraphs(lambda rows, prev: self._draft_eager(rows, prev, pages), graph_batch_sizes, null,
                                 self.device, extra_inputs=[hidden], name="draft")
            if draft_steps > 1:
                chain = DecodeGraphs(lambda rows, prev, budget: self._draft_chain_eager(rows, prev, budget, pages),
                                     chain_batch_sizes or graph_batch_sizes, null, self.device,
                                     extra_inputs=[hidden, ((), torch.int64)], name="draft chain")
        try:
            graphs.capture(progress=progress)
            for more in (draft, chain):
                if more is not None:
                    more.capture(progress=progress, pool=graphs.pool)
        except Exception as exc:  # a backend that cannot be captured: eager decode, said once
            logger.warning(
                "CUDA-graph capture failed (%s: %s); decode runs eagerly (--disable-cuda-graph silences this)",
                type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
            torch.cuda.synchronize(self.device)
            return
        self.graphs = graphs
        self.draft_graphs = draft
        self.chain_graphs = chain

    def decode(self, plan: DecodePlan, *, hidden: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Logits ``[B, vocab]`` fp32 of a decode-shaped step (every row one token, at its plan position; rows of
        one slot at consecutive positions see each other, as a prefill chunk's tokens do), and with ``hidden``
        (runners built with ``nextn`` only) the post-norm hidden ``[B, D]`` too.

        Needs :meth:`setup_decode` and the rows' slots synced (:meth:`RequestSlots.sync`). Replays a CUDA
        graph when one covers B (the returned tensors are then the graph's static output: use them before the
        next step), else runs the same code eagerly over just the pages the longest row needs.
        """
        if self.request_slots is None:
            raise RuntimeError("ModelRunner.decode needs setup_decode() first")
        if hidden and not self.nextn:
            raise RuntimeError("decode(hidden=True) needs a runner built with nextn=True")
        rows = plan.rows.to(self.device, non_blocking=True)
        if self.graphs is not None and plan.batch_size <= self.graphs.max_bs:
            out = self.graphs.run(rows)
        else:
            pages = min(-(-plan.longest // self.cache.page_size), self.request_slots.max_pages)
            out = self._decode_eager(rows, pages, hidden=self.nextn)
        if self.nextn and not hidden:
            return out[0]
        return out

    def draft_decode(self, plan: DecodePlan, prev_hidden: Tensor) -> tuple[Tensor, Tensor]:
        """The NextN layer over decode-shaped rows: ``plan``'s token of each row is the token after the row of
        ``prev_hidden`` ``[B, D]`` (model dtype, the target's or the previous draft step's post-norm hidden), at
        the row's position. Returns logits ``[B, vocab]`` fp32 and the draft's post-norm hidden ``[B, D]``
        (graph memory when replayed: use them before the next draft step)."""
        if self.request_slots is None or not self.nextn:
            raise RuntimeError("ModelRunner.draft_decode needs nextn=True and setup_decode() first")
        rows = plan.rows.to(self.device, non_blocking=True)
        if self.draft_graphs is not None and plan.batch_size <= self.draft_graphs.max_bs:
            return self.draft_graphs.run(rows, prev_hidden)
        pages = min(-(-plan.longest // self.cache.page_size), self.request_slots.max_pages)
        return self._draft_eager(rows, prev_hidden, pages)

    def draft_chain(self, plan: DecodePlan, hidden: Tensor, budget: Tensor) -> Tensor:
        """``draft_steps - 1`` chained NextN steps in one go (one graph replay when captured): row ``i`` of
        ``plan`` holds a request's slot, its first draft ``d_1`` and the position after its last cached token;
        ``hidden`` ``[B, D]`` the hidden state its chain starts from; ``budget`` ``[B]`` int64 how many drafts it
        needs (a row stops, writing nothing of its own, once it has them). Returns ``d_2 .. d_{draft_steps}``
        ``[B, draft_steps - 1]`` int64 (graph memory when replayed). Each step is the argmax of the previous
        one's logits, at the next position, from the previous step's hidden state."""
        if self.request_slots is None or not self.nextn:
            raise RuntimeError("ModelRunner.draft_chain needs nextn=True and setup_decode()")
        rows = plan.rows.to(self.device, non_blocking=True)
        if self.chain_graphs is not None and plan.batch_size <= self.chain_graphs.max_bs:
            return self.chain_graphs.run(rows, hidden, budget)
        pages = min(-(-(plan.longest + self.draft_steps) // self.cache.page_size), self.request_slots.max_pages)
        return self._draft_chain_eager(rows, hidden, budget, pages)

    def _draft_chain_eager(self, rows: Tensor, hidden: Tensor, budget: Tensor, pages: int) -> Tensor:
        slot, token, position = rows[0], rows[1], rows[2]
        null = torch.full_like(slot, self.request_slots.null_slot)
        drafts = []
        for step in range(1, self.draft_steps):
            live = budget > step  # this row still needs d_{step+1}; finished rows go to the null slot
            step_rows = torch.stack([torch.where(live, slot, null), token,
                                     torch.where(live, position + step - 1, torch.zeros_like(position))])
            logits, hidden = self._draft_eager(step_rows, hidden, pages)
            token = logits.argmax(dim=-1)
            drafts.append(token)
        return torch.stack(drafts, dim=1)

    def _rows_context(self, rows: Tensor, pages: int) -> AttnContext:
        """The attention context of decode-shaped plan rows ``[3, B]`` over ``pages`` block-table columns."""
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
        return ctx

    def _decode_eager(self, rows: Tensor, pages: int, hidden: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """The decode forward over plan rows ``[3, B]`` on the device and ``pages`` block-table columns."""
        cache = self.cache
        ctx = self._rows_context(rows, pages)
        with torch.inference_mode():
            h = self.model.hidden_states(ctx, cache.mla, cache.index_k)
            logits = self.model.logits(h)
        return (logits, h) if hidden else logits

    def _draft_eager(self, rows: Tensor, prev_hidden: Tensor, pages: int) -> tuple[Tensor, Tensor]:
        cache = self.cache
        n = self.config.num_hidden_layers
        ctx = self._rows_context(rows, pages)
        with torch.inference_mode():
            g = self.model.draft_hidden_states(ctx, prev_hidden, cache.mla[n],
                                               cache.index_k[n] if cache.index_k else None)
            return self.model.logits(g), g

    def forward(self, batch: ForwardBatch, *, hidden: bool = False) -> list[Tensor | None] | tuple[list, list]:
        """One step; see the module docstring. Raises ``ValueError`` for malformed batches (nothing written).

        With ``hidden`` returns ``(logits, hiddens)``: besides the logits, each sequence's post-norm hidden of
        every new token ``[len, D]`` (what the NextN draft layer reads).
        """
        cache = self.cache
        step = build_step(batch, page_size=cache.page_size, num_pages=cache.num_pages,
                          vocab_size=self.config.vocab_size, device=self.device)
        with torch.inference_mode():
            h = self.model.hidden_states(self._context(step), cache.mla, cache.index_k)
            logits = self._pick_logits(batch, step, h)
        if not hidden:
            return logits
        return logits, [h[meta.t0:meta.t1] for meta in step.seqs]

    def draft_forward(self, batch: ForwardBatch, prev_hidden: Tensor) -> tuple[list[Tensor | None], Tensor]:
        """The NextN layer over a batch (any mix of lengths): ``batch``'s tokens, flattened, are the tokens after
        the rows of ``prev_hidden`` ``[T, D]``; each is cached in the draft pool at its position. Returns the
        logits each sequence asks for and the draft's post-norm hidden of every token ``[T, D]``."""
        if not self.nextn:
            raise RuntimeError("ModelRunner.draft_forward needs a runner built with nextn=True")
        cache = self.cache
        n = self.config.num_hidden_layers
        step = build_step(batch, page_size=cache.page_size, num_pages=cache.num_pages,
                          vocab_size=self.config.vocab_size, device=self.device)
        if prev_hidden.shape[0] != step.num_tokens:
            raise ValueError(f"prev_hidden has {prev_hidden.shape[0]} rows for {step.num_tokens} tokens")
        with torch.inference_mode():
            g = self.model.draft_hidden_states(self._context(step), prev_hidden, cache.mla[n],
                                               cache.index_k[n] if cache.index_k else None)
            return self._pick_logits(batch, step, g), g

    def _pick_logits(self, batch: ForwardBatch, step: StepMeta, hidden: Tensor) -> list[Tensor | None]:
        """Float32 logits of the rows each sequence asks for (``"last"``: ``[vocab]``, ``"all"``: ``[len,
        vocab]``, ``"none"``: None), from one head GEMM over just those rows."""
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
