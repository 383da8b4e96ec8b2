"""Rank processes in lockstep (SPMD) behind the :class:`~dsa_runtime.model.step.Runner` protocol.

Rank 0 lives in the caller's process (it owns the scheduler, the tokenizer and the sampler); ranks ``1 .. n-1``
of this node are spawned (``torch.multiprocessing``, spawn). Every rank owns a runner over its slice of the
weights, with its own KV cache, request-slot state and captured CUDA graphs (collectives inside them). Each step
rank 0 broadcasts the step's token rows as a few int64 tensors (``wire.py``) and every rank runs its part of the
same step; under DP attention each group runs its own rows and the group leaders send their picked rows' outputs
to rank 0. A worker that dies takes the service down: the watchdog checks the workers before every step and
turns a failed collective into :class:`WorkerDiedError` naming the rank and its exit code; collectives time out
(``ParallelConfig.timeout_s``) instead of hanging, and a worker exits when rank 0's process is gone.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

from dsa_runtime.distributed.parallel import ParallelConfig
from dsa_runtime.distributed.wire import OP_CALL, OP_STEP, OP_STOP, Message, lay_out
from dsa_runtime.model.step import Step, StepKind

logger = logging.getLogger(__name__)

class WorkerDiedError(RuntimeError):
    """A tensor-parallel worker process is gone; the service cannot go on."""


@dataclass
class RankSpec:
    """How every rank builds its runner.

    Attributes:
        model_path: checkpoint folder (each rank reads only its slices), or None with ``tensors``.
        tensors: full HF-named tensors in memory (each rank keeps only its slices); ``config`` with them.
        random_seed: with ``config`` and neither of the above: random weights drawn on each rank's
            device, slices only (:mod:`dsa_runtime.distributed.random_weights`; benchmarks at real sizes);
            ``random_fp8``: their linears block-scaled FP8 as the released checkpoints store them, else bf16.
        dtype: model dtype name; device_type: ``cpu`` or ``cuda`` (rank i -> ``cuda:<local rank>``).
        kernel_config: :class:`~dsa_runtime.resolve.KernelConfig` (resolved on every rank with the per-rank
            head count, so head padding applies to the sharded shape).
        num_pages, page_size: every rank's KV cache (the same page ids on every rank of a group).
        mha_max_keys, cpu_threads: as for the single-process runner.
        setup: ``"module:function"`` names called as ``fn()`` on every rank before anything is built
            (tests register extra backends this way); hooks: called as ``fn(runner)`` once it is built.
        nextn: every rank also builds its slice of the MTP layer and a draft cache layer (speculative
            decoding; ``model_path`` or ``tensors`` only).
        config_overrides: ``--json-model-override-args`` of a ``model_path`` checkpoint.
        max_requests, max_model_len, draft_steps: every rank's slot state (``ModelRunner.setup``);
            max_model_len None: the cache's capacity.
        graph_batch_sizes, chain_batch_sizes: the CUDA-graph buckets every rank captures (CUDA only).
    """

    model_path: str | None = None
    tensors: dict[str, Any] | None = None
    config: Any = None
    random_seed: int | None = None
    random_fp8: bool = False
    dtype: str = "bfloat16"
    device_type: str = "cpu"
    kernel_config: Any = None
    num_pages: int = 64
    page_size: int = 16
    mha_max_keys: int = 2048
    cpu_threads: int | None = 1
    setup: list[str] = field(default_factory=list)
    hooks: list[str] = field(default_factory=list)
    nextn: bool = False
    config_overrides: dict[str, Any] = field(default_factory=dict)
    max_requests: int = 16
    max_model_len: int | None = None
    draft_steps: int = 1
    graph_batch_sizes: list[int] = field(default_factory=list)
    chain_batch_sizes: list[int] | None = None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_method(parallel: ParallelConfig) -> str:
    addr = parallel.dist_init_addr or f"127.0.0.1:{free_port()}"
    return f"tcp://{addr}"


def build_rank_runner(spec: RankSpec, tp: Any) -> Any:
    """This rank's ModelRunner over its slice of the weights, with its own KV cache."""
    from dsa_runtime.backend import load_object
    from dsa_runtime.cache import KVCache
    from dsa_runtime.distributed.load import load_rank_checkpoint
    from dsa_runtime.distributed.sharding import shard_tensors, tensor_bytes
    from dsa_runtime.model.runner import ModelRunner, kernel_needs
    from dsa_runtime.resolve import KernelConfig, resolve_kernels

    for name in spec.setup:
        load_object(name)()  # type: ignore[operator]
    info = tp.info
    if spec.model_path is not None:
        from dsa_runtime.loader.overrides import override_checkpoint_config

        part = load_rank_checkpoint(spec.model_path, info, with_tokenizer=False, mtp=spec.nextn)
        config, tensors, loaded = part.config, part.tensors, part.bytes_read
        config = override_checkpoint_config(spec.model_path, config, spec.config_overrides)
    elif spec.tensors is not None:
        config = spec.config
        tensors = shard_tensors(spec.tensors, info, config.num_hidden_layers, mtp=spec.nextn)
        loaded = tensor_bytes(tensors)
    else:
        if spec.nextn:
            raise ValueError("random TP weights have no MTP layer: speculative decoding needs model_path or tensors")
        from dsa_runtime.distributed.random_weights import rank_random_state

        config = spec.config
        tensors = rank_random_state(config, info, tp.device, spec.random_seed or 0, fp8=spec.random_fp8)
        loaded = tensor_bytes(tensors)
    kcfg = spec.kernel_config or KernelConfig(platform="cpu" if spec.device_type == "cpu" else "auto")
    needs = kernel_needs(config, spec.page_size, attn_tp=info.attn_size)
    kernels = resolve_kernels(kcfg, needs=needs)
    cache = KVCache(config, spec.num_pages, spec.page_size, kernels.kv_layout, tp.device, getattr(torch, spec.dtype),
                    draft_layers=int(spec.nextn))
    # release_tensors: this rank's slices are freed as the model is built from them, so building peaks at the
    # model plus one layer (random full-size weights are drawn on the GPU; a checkpoint's slices sit in host RAM).
    runner = ModelRunner(config, tensors, kernels=kernels, cache=cache, dtype=spec.dtype, device=tp.device,
                         mha_max_keys=spec.mha_max_keys, tp=tp, nextn=spec.nextn, release_tensors=True,
                         max_requests=spec.max_requests, max_model_len=spec.max_model_len,
                         draft_steps=spec.draft_steps)
    runner.bytes_loaded = loaded  # type: ignore[attr-defined]
    del tensors
    # Every rank captures the same buckets in the same order: the collectives inside the graphs pair up.
    runner.capture_graphs(spec.graph_batch_sizes, spec.chain_batch_sizes, progress=info.rank == 0)
    with torch.inference_mode():  # the load figures start after the capture's dummy batches
        for layer in runner.model.layers:
            if layer.ffn.ep is not None:
                layer.ffn.tokens_received.zero_()
    for hook in spec.hooks:
        load_object(hook)(runner)  # type: ignore[operator]
    return runner


def _send(tp: Any, msg: Message) -> None:
    """Broadcast ``msg`` to the workers (none with one rank: rank 0 runs the message itself)."""
    import torch.distributed as dist

    if tp.info.world == 1:
        return
    header, payload = msg.encode(tp.info.dp)
    dist.broadcast(header, src=0, group=tp.ctrl_group)
    if payload.numel():
        dist.broadcast(payload, src=0, group=tp.ctrl_group)


def _receive(tp: Any) -> Message:
    import torch.distributed as dist

    header = torch.empty(10 + tp.info.dp, dtype=torch.int64)
    dist.broadcast(header, src=0, group=tp.ctrl_group)
    payload = torch.empty(Message.payload_size(header), dtype=torch.int64)
    if payload.numel():
        dist.broadcast(payload, src=0, group=tp.ctrl_group)
    return Message.decode(header, payload)


def execute(runner: Any, tp: Any, msg: Message, tokens: torch.Tensor | None = None) -> torch.Tensor | None:
    """This rank's part of a step (every rank runs it, rank 0 with the sampled ``tokens`` it publishes): the
    published tokens first, then its group's rows; a group leader other than rank 0's sends its output there."""
    import torch.distributed as dist

    if msg.publish is not None:
        if tokens is None:
            tokens = torch.empty(msg.publish.numel(), dtype=torch.int64, device=tp.device)
        if tp.info.world > 1:
            dist.broadcast(tokens, src=0, group=tp.world_group)
        runner.publish(msg.publish, tokens)
    out = runner.run(msg.local_step(tp.info.dp_rank))
    info = tp.info
    if info.dp > 1 and out is not None and info.attn_rank == 0 and info.dp_rank != 0 and out.shape[0]:
        dist.send(out.contiguous(), dst=0, group=tp.world_group)
    return out


def _watch_parent(parent: int) -> None:
    """Exit when the process that spawned this worker is gone (no orphan waiting forever)."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(3)


def worker_main(local_rank: int, parallel: ParallelConfig, spec: RankSpec, method: str, parent: int) -> None:
    """Entry of a spawned worker: init the groups, build the runner, then serve steps until ``stop``."""
    import torch.distributed as dist

    from dsa_runtime.distributed.comm import init_groups

    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    rank = parallel.node_rank * parallel.ranks_per_node + local_rank
    if spec.cpu_threads:
        torch.set_num_threads(spec.cpu_threads)
    device = torch.device(f"cuda:{local_rank}") if spec.device_type == "cuda" else torch.device("cpu")
    try:
        tp = init_groups(parallel, rank, device, method)
        runner = build_rank_runner(spec, tp)
        while True:
            msg = _receive(tp)
            if msg.op == OP_STOP:
                break
            if msg.op == OP_CALL:
                from dsa_runtime.backend import load_object

                box: list[Any] = [None]
                dist.broadcast_object_list(box, src=0, group=tp.ctrl_group)
                dist.gather_object(load_object(box[0])(runner), None, dst=0, group=tp.ctrl_group)
                continue
            execute(runner, tp, msg)
        dist.destroy_process_group()
    except Exception:
        sys.stderr.write(f"dsa-runtime: tensor-parallel rank {rank} failed:\n{traceback.format_exc()}")
        sys.stderr.flush()
        os._exit(1)


def _rank0(name: str) -> property:
    return property(lambda self: getattr(self.runner, name), doc=f"rank 0's runner's ``{name}``")


class DistributedRunner:
    """Rank 0's view: a :class:`~dsa_runtime.model.step.Runner` over all ranks.

    Starts the workers of this node (ranks 1 .. ranks_per_node-1), joins the process group as rank 0 and
    builds its own slice. ``shutdown()`` stops the workers (also at interpreter exit). With one rank it runs the
    same code with nobody to send to (``--distributed-executor-backend mp`` at ``--tp 1``).
    """

    def __init__(self, parallel: ParallelConfig, spec: RankSpec) -> None:
        import torch.multiprocessing as mp

        from dsa_runtime.distributed.comm import init_groups

        if parallel.node_rank != 0:
            raise ValueError("the scheduler runs on node 0; other nodes run serve_worker_node()")
        self.parallel, self.spec = parallel, spec
        method = init_method(parallel)
        ctx = mp.get_context("spawn")
        self.procs = []
        for local in range(1, parallel.ranks_per_node):
            p = ctx.Process(target=worker_main, args=(local, parallel, spec, method, os.getpid()), daemon=True)
            p.start()
            self.procs.append(p)
        self._closed = False
        self.runner: Any = None
        self._slot_group = torch.zeros(spec.max_requests + 1, dtype=torch.int64)  # DP: each slot's group
        self._publish: list[tuple[torch.Tensor, torch.Tensor]] = []  # sampled tokens the next step sends
        self._hidden_layout: Any = None  # DP: the group layout of the last TARGET step that kept hidden states
        device = torch.device("cuda:0") if spec.device_type == "cuda" else torch.device("cpu")
        try:
            self.tp = init_groups(parallel, 0, device, method)
            self.runner = build_rank_runner(spec, self.tp)
        except Exception as exc:
            self._kill()
            raise self._died(exc) from exc
        import atexit

        atexit.register(self.shutdown)

    # The Runner protocol, and what the engine's extras read: rank 0's runner's (every rank's are alike).
    config = _rank0("config")
    cache = _rank0("cache")
    kernels = _rank0("kernels")
    dtype = _rank0("dtype")
    device = _rank0("device")
    max_requests = _rank0("max_requests")
    max_pages = _rank0("max_pages")
    graph_rows = _rank0("graph_rows")

    @property
    def nextn(self) -> bool:
        return self.spec.nextn

    @property
    def closed(self) -> bool:
        """Shut down, or stopped after a failure: no rank answers any more."""
        return self._closed

    def check_workers(self) -> None:
        """Raise :class:`WorkerDiedError` when a worker of this node has exited."""
        for local, p in enumerate(self.procs, start=1):
            if not p.is_alive():
                raise WorkerDiedError(
                    f"tensor-parallel worker rank {local} (pid {p.pid}) exited with code {p.exitcode}; "
                    "the model cannot run without it, stopping"
                )

    def _died(self, exc: BaseException) -> BaseException:
        time.sleep(0.2)  # let a crashing worker's exit code land
        try:
            self.check_workers()
        except WorkerDiedError as died:
            return died
        if isinstance(exc, RuntimeError) and ("timed out" in str(exc).lower() or "connection" in str(exc).lower()):
            return WorkerDiedError(f"a tensor-parallel collective failed ({str(exc).splitlines()[0][:200]}); "
                                   "a peer rank is gone or stuck, stopping")
        return exc

    def publish(self, slots: torch.Tensor, tokens: torch.Tensor) -> None:
        """Sampled tokens for the slots' next rows of token -1: sent with the next step, to every rank."""
        self._publish.append((slots, tokens))

    def run(self, step: Step) -> torch.Tensor | None:
        """Run ``step`` on every rank (``ModelRunner.run``'s contract); the output, on rank 0."""
        if self._closed:
            raise WorkerDiedError("the tensor-parallel runtime was shut down")
        self.check_workers()
        runner = self.runner
        if self.parallel.tp > 1:  # validate before any rank starts: a bad step is one clear error, nobody waits
            step.check(runner.max_requests, runner.max_pages, runner.cache.page_size, runner.config.vocab_size)
        dp = self.parallel.dp
        if step.pages is not None and dp > 1:  # a slot's group: its first page's (dsa_runtime.distributed.dp)
            first = step.pages[1] == 0
            self._slot_group[step.pages[0, first]] = step.pages[2, first] % dp
        publish = tokens = None
        if len(self._publish) == 1:
            publish, tokens = self._publish[0]
        elif self._publish:
            publish = torch.cat([s for s, _ in self._publish])
            tokens = torch.cat([t for _, t in self._publish])
        layout = order = None
        if dp == 1:
            msg = Message(OP_STEP, step, step.num_rows, None, publish)
        else:
            groups = self._slot_group[step.rows[0]]
            laid, layout, picks, order = lay_out(step, groups, dp, runner.max_requests)
            self.tp.real_tokens = torch.bincount(groups, minlength=dp).tolist()
            if step.source is not None:  # rows of the kept hidden states, as group-local rows
                last = self._hidden_layout
                laid.source = torch.zeros(laid.num_rows, dtype=torch.int64)
                laid.source[layout.position] = last.position[step.source] % last.group_rows
            msg = Message(OP_STEP, laid, layout.group_rows, picks, publish)
        try:
            _send(self.tp, msg)
            self._publish = []
            out = execute(runner, self.tp, msg, tokens)
            if layout is not None:
                if step.kind is StepKind.TARGET and step.hidden:
                    self._hidden_layout = layout
                if out is not None:
                    out = self._gather(out, msg, layout.position if order is None else order)
        except Exception as exc:
            self._closed = True
            self._kill()
            raise self._died(exc) from exc
        return out

    def _gather(self, out: torch.Tensor, msg: Message, index: torch.Tensor) -> torch.Tensor:
        """DP attention: every group's output (its leader sends it), concatenated in group order, then ``index``
        picks the step's rows in its own order."""
        import torch.distributed as dist

        parts = [out]
        attn = self.parallel.attn_size
        for g in range(1, self.parallel.dp):
            n = msg.picks[g] if msg.picks is not None else msg.group_rows
            if n:
                buf = torch.empty(n, *out.shape[1:], dtype=out.dtype, device=out.device)
                dist.recv(buf, src=g * attn, group=self.tp.world_group)
                parts.append(buf)
        return torch.cat(parts).index_select(0, index.to(out.device))

    def ep_tokens(self) -> list[int]:
        """Token rows received per EP rank so far (summed over the EP groups and MoE layers); [] without EP."""
        ep = self.parallel.ep
        if ep == 1:
            return []
        counts = self.collect("dsa_runtime.distributed.runtime:ep_tokens")
        return [sum(counts[q::ep]) for q in range(ep)]

    def collect(self, fn: str) -> list[Any]:
        """``fn(runner)`` (a ``"module:function"`` name) on every rank, in rank order (tests, diagnostics)."""
        import torch.distributed as dist

        from dsa_runtime.backend import load_object

        self.check_workers()
        _send(self.tp, Message(OP_CALL))
        dist.broadcast_object_list([fn], src=0, group=self.tp.ctrl_group)
        out: list[Any] = [None] * self.parallel.tp
        dist.gather_object(load_object(fn)(self.runner), out, dst=0, group=self.tp.ctrl_group)  # type: ignore[operator]
        return out

    def _kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(timeout=5)

    def shutdown(self) -> None:
        """Stop the workers and leave the process group (idempotent). Rank 0's model is released: the atexit
        hook no longer keeps it (a benchmark that builds topology after topology needs the memory back)."""
        import atexit

        import torch.distributed as dist

        atexit.unregister(self.shutdown)
        self.runner = None
        if self._closed:
            if dist.is_initialized():
                dist.destroy_process_group()
            return
        self._closed = True
        try:
            if all(p.is_alive() for p in self.procs):
                _send(self.tp, Message(OP_STOP))
            for p in self.procs:
                p.join(timeout=10)
        finally:
            self._kill()
            if dist.is_initialized():
                dist.destroy_process_group()


def serve_worker_node(parallel: ParallelConfig, spec: RankSpec) -> int:
    """Multi-node: run this node's ranks (``--node-rank`` > 0) until node 0 stops them; exit code."""
    import torch.multiprocessing as mp

    method = init_method(parallel)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker_main, args=(local, parallel, spec, method, os.getpid()))
             for local in range(parallel.ranks_per_node)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    bad = [p.exitcode for p in procs if p.exitcode]
    return 1 if bad else 0


def loaded_bytes(runner: Any) -> int:
    """Bytes of weights this rank loaded (for ``DistributedRunner.collect``)."""
    return int(getattr(runner, "bytes_loaded", 0))


def ep_tokens(runner: Any) -> int:
    """Token rows this rank's experts received so far, over its MoE layers (for ``DistributedRunner.collect``)."""
    counts = [layer.ffn.tokens_received for layer in runner.model.layers if layer.ffn.ep is not None]
    return int(torch.stack(counts).sum()) if counts else 0


def memory_stats(runner: Any) -> dict[str, int]:
    """This rank's device memory in bytes (for ``DistributedRunner.collect``): weights loaded, KV cache, and on
    CUDA the allocator's allocated / peak allocated / reserved bytes and the device's total."""
    out = {"weights": loaded_bytes(runner), "kv_cache": int(getattr(runner.cache, "total_bytes", 0))}
    dev = torch.device(runner.device)
    if dev.type == "cuda":
        out.update(allocated=torch.cuda.memory_allocated(dev), peak=torch.cuda.max_memory_allocated(dev),
                   reserved=torch.cuda.memory_reserved(dev), total=torch.cuda.get_device_properties(dev).total_memory)
    return out
