"""CUDA-graph decode: the whole decode forward (every layer, indexer, top-k, sparse attention, MoE, head)
captured once per batch-size bucket and replayed with its inputs copied into static buffers.

A step of ``B`` rows replays the smallest bucket ``>= B``; the rows past ``B`` are inert (the null slot of
:class:`~dsa_runtime.model.slots.SlotState`: page 0, position 0, length 1, token 0), so they write
and read only page 0, which no request owns. The graph reads the step's token rows (slot, token, position) from
a static ``[3, max_bs]`` buffer and derives the block tables, lengths and KV slots itself, so one copy of
``3 * B`` integers is the whole per-step input. Buckets are captured largest first into one memory pool (as
SGLang, vLLM and nano-vllm do); capture time and memory are logged.

The logits a replay returns live in the graph's static output: consume them (sample) before the next step.
A forward may return a tuple of tensors (logits and hidden states, for MTP drafting) and take extra static
inputs beside the rows (the draft layer's previous hidden states), each ``[bs, ...]``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

logger = logging.getLogger(__name__)


def default_batch_sizes(max_bs: int) -> list[int]:
    """SGLang's buckets ``[1, 2, 4, 8] + range(16, max_bs + 1, 8)``, cut at ``max_bs`` (which is included)."""
    if max_bs < 1:
        raise ValueError(f"the largest CUDA-graph batch must be >= 1, got {max_bs}")
    sizes = [s for s in (1, 2, 4, 8) if s <= max_bs] + list(range(16, max_bs + 1, 8))
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


class DecodeGraphs:
    """Captured decode graphs, one per bucket.

    Args:
        forward: ``forward(rows [3, bs] int64 on the device, *extras) -> logits [bs, vocab] fp32`` (or a tuple
            of ``[bs, ...]`` tensors), the eager decode of a fixed block-table width (graph-safe: no host
            reads, shapes from ``bs`` only).
        batch_sizes: the buckets.
        null_slot: the slot id of an inert row.
        device: a CUDA device.
        extra_inputs: ``(shape past the batch dimension, dtype)`` of each extra static input.
        name: what the capture's progress bar and log call these graphs.
    """

    def __init__(self, forward: Callable[..., Tensor | tuple[Tensor, ...]], batch_sizes: Sequence[int],
                 null_slot: int, device: torch.device,
                 extra_inputs: Sequence[tuple[tuple[int, ...], torch.dtype]] = (), name: str = "decode") -> None:
        self.forward = forward
        self.sizes = sorted({int(s) for s in batch_sizes})
        if not self.sizes or self.sizes[0] < 1:
            raise ValueError(f"CUDA-graph batch sizes must be >= 1, got {list(batch_sizes)}")
        self.null_slot = null_slot
        self.device = device
        self.rows = torch.zeros(3, self.sizes[-1], dtype=torch.int64, device=device)
        self.rows[0].fill_(null_slot)
        self.extras = [torch.zeros(self.sizes[-1], *shape, dtype=dtype, device=device)
                       for shape, dtype in extra_inputs]
        self.name = name
        self.pool = None
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, Tensor | tuple[Tensor, ...]] = {}
        self.capture_s = 0.0
        self.capture_bytes = 0

    @property
    def max_bs(self) -> int:
        return self.sizes[-1]

    def capture(self, progress: bool = True, pool=None) -> None:
        """Warm up and capture every bucket, largest first, into one pool (``pool``: share another set's)."""
        from tqdm import tqdm

        torch.cuda.synchronize(self.device)
        before = torch.cuda.memory_reserved(self.device)
        start = time.perf_counter()
        sizes = list(reversed(self.sizes))
        bar = tqdm(sizes, desc=f"Capturing {self.name} CUDA graphs", unit="graph", disable=not progress, leave=False)
        for bs in bar:
            bar.set_postfix(bs=bs)
            rows = self.rows[:, :bs]
            extras = [x[:bs] for x in self.extras]
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(2):  # compiles, autotunes and lazy buffers happen here, outside the capture
                    self.forward(rows, *extras)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bs] = self.forward(rows, *extras)
            pool = graph.pool()
            self.graphs[bs] = graph
        self.pool = pool
        torch.cuda.synchronize(self.device)
        self.capture_s = time.perf_counter() - start
        self.capture_bytes = torch.cuda.memory_reserved(self.device) - before
        logger.info("captured %d %s CUDA graphs (batch %d..%d) in %.1f s, %.1f MiB", len(self.graphs), self.name,
                    self.sizes[0], self.max_bs, self.capture_s, self.capture_bytes / 2**20)

    def bucket(self, batch: int) -> int:
        for size in self.sizes:
            if size >= batch:
                return size
        raise ValueError(f"batch {batch} exceeds the largest CUDA-graph batch {self.max_bs}")

    def run(self, rows: Tensor, *extras: Tensor) -> Tensor | tuple[Tensor, ...]:
        """Replay for plan rows ``[3, B]`` (int64, on the device) and the extra inputs ``[B, ...]`` -> logits
        ``[B, vocab]`` or the forward's tuple, cut to ``B`` rows (static memory)."""
        batch = int(rows.shape[1])
        bs = self.bucket(batch)
        self.rows[:, :batch].copy_(rows, non_blocking=True)
        for static, x in zip(self.extras, extras, strict=True):
            static[:batch].copy_(x, non_blocking=True)
        if bs > batch:  # inert rows: null slot, token 0, position 0
            self.rows[0, batch:bs].fill_(self.null_slot)
            self.rows[1:, batch:bs].zero_()
        self.graphs[bs].replay()
        out = self.outputs[bs]
        if isinstance(out, tuple):
            return tuple(o[:batch] for o in out)
        return out[:batch]
