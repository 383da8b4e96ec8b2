"""ModelRunner: one rank's model, its paged KV cache and its per-slot device state, run one :class:`Step` at a
time (``docs/engine.md`` draws the step's data flow).

:meth:`ModelRunner.run` takes a step's token rows (``core/model/step.py``): it writes every row's MLA row and
index-K row into the paged cache at the row's slot and position (every layer), then returns the float32 logits
of the rows the step picks. A step that fits a captured CUDA graph replays it (every row a decode row); other
steps run eagerly, their long runs of one slot's rows (prompt chunks) through the ragged prefill kernels and the
rest as decode rows.

Model dtype: bfloat16 (default) or float32. With float32 the kernels receive float32 activations; the
``reference`` backend computes in fp32 either way, GPU kernels need bfloat16, so float32 is a CPU /
verification mode. Kernel outputs (sparse attention, MoE) are bf16 by contract in both modes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from dsa_runtime.distributed.sharding import tensor_bytes
from dsa_runtime.model.attention import AttnContext, DecodeTables
from dsa_runtime.model.batch import SeqMeta, StepMeta
from dsa_runtime.model.config import ModelConfig
from dsa_runtime.model.decode_graph import DecodeGraphs
from dsa_runtime.model.deepseek import DeepseekModel
from dsa_runtime.model.slots import SlotState, row_inputs
from dsa_runtime.model.step import Step, StepKind, spans

if TYPE_CHECKING:
    from dsa_runtime.cache.kv_cache import KVCache

logger = logging.getLogger(__name__)

__all__ = ["ModelRunner", "kernel_needs"]

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
        max_requests, max_model_len, draft_steps: the slot state (:meth:`setup`); max_model_len defaults to
            the cache's capacity.
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
        max_requests: int = 16,
        max_model_len: int | None = None,
        draft_steps: int = 1,
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
        self.bytes_loaded = tensor_bytes(tensors)  # before release_tensors empties the dict
        with torch.inference_mode():
            self.model = DeepseekModel(config, tensors, dtype=self.dtype, device=self.device, tp=tp,
                                       moe_fp32_sum=moe_fp32_sum, nextn=nextn, release_tensors=release_tensors)
        self.setup(max_requests, max_model_len or cache.num_pages * cache.page_size, draft_steps)

    @classmethod
    def from_checkpoint(cls, checkpoint, **kwargs) -> ModelRunner:
        """Build from a loader ``Checkpoint`` (``.config``, ``.tensors``, ``.mtp_tensors``)."""
        return cls(checkpoint.config, checkpoint.all_tensors(), **kwargs)

    def load_weights(self, tensors: dict[str, Tensor]) -> None:
        """Replace every weight from a new HF-named tensor dict (same config); the cache is kept."""
        self.bytes_loaded = tensor_bytes(tensors)
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


    # --- slot state and graphs ----------------------------------------------------------------------------------
    def setup(self, max_requests: int, max_model_len: int, draft_steps: int = 1) -> None:
        """(Re)allocate the per-slot device state: ``max_requests`` slots whose block tables cover
        ``max_model_len`` tokens, and with a NextN layer ``draft_steps`` draft tokens and a chain hidden state per
        slot. Captured graphs are dropped (they read the old state)."""
        ps = self.cache.page_size
        self.draft_steps = draft_steps
        self.state = SlotState(max_requests, -(-max_model_len // ps), self.device, drafts=draft_steps if self.nextn else 0)
        self.chain_hidden = (torch.zeros(max_requests + 1, self.config.hidden_size, dtype=self.dtype, device=self.device)
                             if self.nextn else None)
        # Runs of one slot's rows up to this long are decode rows in an eager step (a verify, a draft extend);
        # longer runs are prompt chunks for the ragged prefill kernels.
        self.decode_span_max = draft_steps + 1 if self.nextn else 1
        self.graphs: dict[StepKind, DecodeGraphs] = {}
        # Steps of at most this many rows run every row as a decode row (the captured graphs' shape; replayed
        # where a graph covers them): the largest graph's rows, 0 without graphs.
        self.graph_rows = 0
        self._hidden: Tensor | None = None  # the last TARGET step's hidden states (Step.hidden), for DRAFT

    @property
    def max_requests(self) -> int:
        return self.state.max_requests

    @property
    def max_pages(self) -> int:
        return self.state.max_pages

    def capture_graphs(self, batch_sizes: list[int] | None, chain_batch_sizes: list[int] | None = None,
                       progress: bool = True) -> None:
        """On CUDA, capture the TARGET forward per batch bucket (and with a NextN layer a DRAFT step per bucket and
        the CHAIN of ``chain_batch_sizes``, default the same). Under tensor parallelism every rank captures the
        same buckets in the same order, its collectives inside the graphs.

        A capture that fails (a kernel that reads the device from the host, say) is logged with its reason and
        steps run eagerly.
        """
        self.graphs = {}
        self.graph_rows = 0
        if not batch_sizes or self.device.type != "cuda":
            return
        pages, null = self.state.max_pages, self.state.null_slot
        graphs = {StepKind.TARGET: DecodeGraphs(lambda rows: self._graph_forward(rows, pages), batch_sizes, null,
                                                self.device)}
        if self.nextn:
            hidden = ((self.config.hidden_size,), self.dtype)
            graphs[StepKind.DRAFT] = DecodeGraphs(lambda rows, prev: self._graph_forward(rows, pages, prev),
                                                  batch_sizes, null, self.device, extra_inputs=[hidden], name="draft")
            if self.draft_steps > 1:
                graphs[StepKind.CHAIN] = DecodeGraphs(
                    lambda rows, prev, budget: self._chain(rows, prev, budget, pages),
                    chain_batch_sizes or batch_sizes, null, self.device,
                    extra_inputs=[hidden, ((), torch.int64)], name="draft chain")
        pool = None
        try:
            for graph in graphs.values():
                graph.capture(progress=progress, pool=pool)
                pool = graph.pool
        except Exception as exc:  # a backend that cannot be captured: eager steps, said once
            logger.warning(
                "CUDA-graph capture failed (%s: %s); steps run eagerly (--disable-cuda-graph silences this)",
                type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
            torch.cuda.synchronize(self.device)
            return
        self.graphs = graphs
        self.graph_rows = graphs[StepKind.TARGET].max_bs

    # --- the step -----------------------------------------------------------------------------------------------
    def run(self, step: Step) -> Tensor | None:
        """Run one step (``core/model/step.py``): ``TARGET`` returns logits ``[S, vocab]`` fp32 of the picked
        rows, ``CHAIN`` the drafts ``[R, draft_steps]`` int64, ``DRAFT`` None. A replayed graph's outputs are its
        static memory: use them before the next step."""
        if step.pages is not None:
            self.state.apply(step.pages)
        if step.kind is not StepKind.TARGET and not self.nextn:
            raise RuntimeError(f"a {step.kind.name} step needs a runner built with its NextN layer (nextn=True)")
        if step.num_rows == 0:
            raise ValueError("a step needs at least one row")
        rows = step.rows.to(self.device, non_blocking=True)
        pick = None if step.pick is None else step.pick.to(self.device, non_blocking=True)
        graph = self.graphs.get(step.kind)
        if graph is not None and step.num_rows > graph.max_bs:
            graph = None
        if step.kind is StepKind.CHAIN:
            return self._run_chain(step, rows, graph)
        prev = None
        if step.kind is StepKind.DRAFT:
            if self._hidden is None or step.source is None:
                raise RuntimeError("a DRAFT step continues the hidden states of a TARGET step run with hidden=True")
            prev = self._hidden.index_select(0, step.source.to(self.device, non_blocking=True))
        if step.num_rows <= self.graph_rows:  # every row a decode row, replayed where a graph covers them
            if graph is not None:
                out = graph.run(rows) if prev is None else graph.run(rows, prev)
            else:
                out = self._graph_forward(rows, self._pages(step.longest), prev)
            logits, hidden = out if isinstance(out, tuple) else (out, None)
            if pick is not None:
                logits = logits.index_select(0, pick)
        else:
            logits, hidden = self._eager(step, rows, pick, prev)
        if step.kind is StepKind.DRAFT:
            picked = hidden if pick is None else hidden.index_select(0, pick)
            slots = rows[0] if pick is None else rows[0].index_select(0, pick)
            self.state.tokens[slots, 1] = logits.argmax(dim=-1)
            self.chain_hidden[slots] = picked.to(self.chain_hidden.dtype)
            return None
        if step.hidden:
            if not self.nextn:
                raise RuntimeError("Step.hidden needs a runner built with its NextN layer (nextn=True)")
            self._hidden = hidden
        return logits

    def publish(self, slots: Tensor, tokens: Tensor) -> None:
        """Each slot's newly sampled token (``tokens`` on the device), read by the next step's rows of token -1."""
        self.state.publish(slots, tokens)

    def shutdown(self) -> None:
        """Nothing to stop: one process, no workers (its memory goes with the runner)."""

    def _pages(self, longest: int) -> int:
        return min(-(-longest // self.cache.page_size), self.state.max_pages)

    def _run_chain(self, step: Step, rows: Tensor, graph: DecodeGraphs | None) -> Tensor:
        slot = rows[0]
        first = self.state.tokens[slot, 1]
        if self.draft_steps == 1:
            return first[:, None]
        if step.budget is None:
            raise ValueError("a CHAIN step needs each row's draft budget")
        chain_rows = torch.stack([slot, first, rows[2]])
        hidden = self.chain_hidden.index_select(0, slot)
        budget = step.budget.to(self.device, non_blocking=True)
        if graph is not None:
            drafts = graph.run(chain_rows, hidden, budget)
        else:
            drafts = self._chain(chain_rows, hidden, budget, self._pages(step.longest + self.draft_steps))
        self.state.tokens[slot, 2:] = drafts
        return torch.cat([first[:, None], drafts], dim=1)

    def _chain(self, rows: Tensor, hidden: Tensor, budget: Tensor, pages: int) -> Tensor:
        """``draft_steps - 1`` chained NextN steps: row ``i`` holds a slot, its first draft and the position after
        its last cached token; ``hidden`` ``[B, D]`` the state its chain starts from; ``budget`` ``[B]`` the drafts
        it needs (a row stops, writing nothing of its own, once it has them). Returns ``[B, draft_steps - 1]``,
        each the argmax of the previous step's logits, at the next position."""
        slot, token, position = rows[0], rows[1], rows[2]
        null = torch.full_like(slot, self.state.null_slot)
        drafts = []
        for step in range(1, self.draft_steps):
            live = budget > step  # this row still needs d_{step+1}; finished rows go to the null slot
            step_rows = torch.stack([torch.where(live, slot, null), token,
                                     torch.where(live, position + step - 1, torch.zeros_like(position))])
            logits, hidden = self._graph_forward(step_rows, pages, hidden)
            token = logits.argmax(dim=-1)
            drafts.append(token)
        return torch.stack(drafts, dim=1)

    def _graph_forward(self, rows: Tensor, pages: int, prev: Tensor | None = None):
        """A step whose every row is a decode row, over ``pages`` block-table columns (graph-safe): the model
        (``prev`` None) -> logits ``[B, vocab]`` (and with a NextN layer the hidden ``[B, D]``), or the NextN layer
        over ``prev`` -> (logits, hidden)."""
        ctx = self._context_of(rows, pages)
        logits, h = self._layers(ctx, prev, None)
        if prev is None and not self.nextn:
            return logits
        return logits, h

    def _eager(self, step: Step, rows: Tensor, pick: Tensor | None, prev: Tensor | None):
        """An eager step over just the pages its longest row reads: runs of one slot longer than
        ``decode_span_max`` rows are prompt chunks (ragged prefill kernels), the other rows decode rows. Returns
        the picked rows' logits and every row's hidden."""
        longest = step.longest
        firsts, counts = spans(step.rows)
        chunks = [i for i, n in enumerate(counts) if n > self.decode_span_max]
        ctx = self._context_of(rows, self._pages(longest), step.rows, [(firsts[i], counts[i]) for i in chunks])
        return self._layers(ctx, prev, pick)

    def _layers(self, ctx: AttnContext, prev: Tensor | None, pick: Tensor | None) -> tuple[Tensor, Tensor]:
        cache = self.cache
        if self.tp is not None:  # DP attention: every group's rows are padded to one count (the FFN gather's)
            self.tp.group_tokens = [ctx.step.num_tokens] * self.tp.info.dp
        with torch.inference_mode():
            if prev is None:
                h = self.model.hidden_states(ctx, cache.mla, cache.index_k)
            else:
                n = self.config.num_hidden_layers
                h = self.model.draft_hidden_states(ctx, prev, cache.mla[n], cache.index_k[n] if cache.index_k else None)
            logits = self.model.logits(h if pick is None else h.index_select(0, pick))
        return logits, h

    def _context_of(self, rows: Tensor, pages: int, host_rows: Tensor | None = None,
                    chunks: list[tuple[int, int]] = ()) -> AttnContext:
        """The attention context of token rows ``[3, B]`` on the device over ``pages`` block-table columns;
        ``chunks`` (first row, length) are the prompt chunks among them (``host_rows`` gives their slots and
        positions), every other row a decode row."""
        ps = self.cache.page_size
        ids, pos, locs, lens, table = row_inputs(rows, self.state, ps, pages)
        batch = ids.shape[0]
        seqs: list[SeqMeta] = []
        page_tables = None
        decode_rows: Tensor | None = None
        if chunks:
            heads = host_rows[:, [t0 for t0, _ in chunks]]
            starts = heads[2].tolist()
            widths = [-(-(start + n) // ps) for start, (_, n) in zip(starts, chunks, strict=True)]
            page_tables = self.state.block_table[heads[0].to(self.device), :max(widths)].long()
            for j, ((t0, n), start) in enumerate(zip(chunks, starts, strict=True)):
                seqs.append(SeqMeta(j, t0, t0 + n, start, start + n, page_tables[j, :widths[j]]))
            mask = torch.ones(batch, dtype=torch.bool)
            for t0, n in chunks:
                mask[t0:t0 + n] = False
            decode_rows = mask.nonzero().flatten().to(self.device) if bool(mask.any()) else None
        ctx = self._context(StepMeta(seqs, ids, pos, locs, ps, page_tables))
        if not chunks or decode_rows is not None:
            if decode_rows is not None:
                lens, table = lens.index_select(0, decode_rows), table.index_select(0, decode_rows)
            n = int(lens.shape[0])
            ctx.decode = DecodeTables(
                lens=lens, table=table, rows=torch.arange(n, dtype=torch.int32, device=self.device),
                starts=torch.zeros(n, dtype=torch.int32, device=self.device), width=pages * ps, index=decode_rows,
            )
        return ctx
