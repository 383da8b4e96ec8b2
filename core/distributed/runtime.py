"""Worker processes in lockstep behind the ModelRunner interface.

Rank 0 lives in the caller's process (it owns the scheduler and the tokenizer); ranks ``1 .. n-1`` of this
node are spawned (``torch.multiprocessing``, spawn). Each step rank 0 broadcasts the :class:`ForwardBatch`
on the gloo ``ctrl`` group; every rank runs its slice of the model; under DP attention the attention-group
leaders send their sequences' logits to rank 0. A worker that dies takes the service down: the watchdog
checks the workers before every step and turns a failed collective into :class:`WorkerDiedError` naming
the rank and its exit code; collectives time out (``ParallelConfig.timeout_s``) instead of hanging, and a
worker exits when rank 0's process is gone.
"""

from __future__ import annotations

import itertools
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

from dsa_runtime.distributed.dp import split_batch
from dsa_runtime.distributed.parallel import ParallelConfig

logger = logging.getLogger(__name__)
STOP = "stop"


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
                         mha_max_keys=spec.mha_max_keys, tp=tp, nextn=spec.nextn, release_tensors=True)
    runner.bytes_loaded = loaded  # type: ignore[attr-defined]
    del tensors
    for hook in spec.hooks:
        load_object(hook)(runner)  # type: ignore[operator]
    return runner


def run_step(runner: Any, tp: Any, batch: Any, *, hidden: bool = False, draft: Any = None) -> dict[int, Any]:
    """One step on this rank; returns ``{batch index: result}`` of the sequences its group served: logits, or
    with ``hidden`` ``(logits, hidden rows)`` of the main model, or with ``draft`` (the previous hidden states
    ``[T, D]`` of the whole batch, speculative decoding) ``(logits, hidden rows)`` of the NextN layer."""
    from dsa_runtime.model.batch import ForwardBatch

    def call(sub: Any, prev: Any) -> list[Any]:
        if draft is not None:
            logits, g = runner.draft_forward(sub, prev)
            return list(zip(logits, g.split([len(s.token_ids) for s in sub.seqs]), strict=True))
        if hidden:
            return list(zip(*runner.forward(sub, hidden=True), strict=True))
        return runner.forward(sub)

    info = tp.info
    if info.dp == 1:
        return dict(enumerate(call(batch, draft)))
    groups = split_batch(batch, info.dp)
    tp.group_tokens = [sum(len(batch.seqs[i].token_ids) for i in g) for g in groups]
    mine = groups[info.dp_rank]
    if not mine:
        with torch.inference_mode():
            runner.model.idle_layers(runner.kernels, draft=draft is not None)
        return {}
    prev = None
    if draft is not None:  # this group's rows of the previous hidden states
        starts = [0, *itertools.accumulate(len(s.token_ids) for s in batch.seqs)]
        prev = torch.cat([draft[starts[i]:starts[i + 1]] for i in mine])
    out = call(ForwardBatch([batch.seqs[i] for i in mine]), prev)
    return dict(zip(mine, out, strict=True))


def _to_device(value: Any, device: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_to_device(v, device) for v in value)
    return value.to(device) if value is not None else None


def _to_cpu(value: Any) -> Any:
    """A compact CPU copy: a sequence's logits are often a row view of the step's ``[T, V]`` logits, and pickling
    a view writes its whole storage (every row of the step, once per sequence)."""
    if isinstance(value, tuple):
        return tuple(_to_cpu(v) for v in value)
    return value.to("cpu", copy=True) if value is not None else None


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
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=0, group=tp.ctrl_group)
            msg = box[0]
            if msg == STOP:
                break
            kind, payload = msg
            if kind == "call":
                from dsa_runtime.backend import load_object

                dist.gather_object(load_object(payload)(runner), None, dst=0, group=tp.ctrl_group)
                continue
            try:
                if kind == "draft":  # the NextN layer (speculative decoding)
                    batch, prev = payload
                    result = run_step(runner, tp, batch, draft=prev.to(device))
                else:
                    result = run_step(runner, tp, payload, hidden=kind == "step_hidden")
            except ValueError:
                continue  # a malformed batch: rank 0 raises the same one-line error before any collective
            if parallel.dp > 1:
                mine = {i: _to_cpu(v) for i, v in result.items()}
                dist.gather_object(mine if tp.info.attn_rank == 0 else None, None, dst=0, group=tp.ctrl_group)
        dist.destroy_process_group()
    except Exception:
        sys.stderr.write(f"dsa-runtime: tensor-parallel rank {rank} failed:\n{traceback.format_exc()}")
        sys.stderr.flush()
        os._exit(1)


class DistributedRunner:
    """Rank 0's view: the ModelRunner interface (``forward(ForwardBatch)``) over all ranks.

    Starts the workers of this node (ranks 1 .. ranks_per_node-1), joins the process group as rank 0 and
    builds its own slice. ``shutdown()`` stops the workers (also at interpreter exit).
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
        device = torch.device("cuda:0") if spec.device_type == "cuda" else torch.device("cpu")
        try:
            self.tp = init_groups(parallel, 0, device, method)
            self.runner = build_rank_runner(spec, self.tp)
        except Exception as exc:
            self._kill()
            raise self._died(exc) from exc
        import atexit

        atexit.register(self.shutdown)

    # The attributes the engine reads from a runner.
    @property
    def config(self) -> Any:
        return self.runner.config

    @property
    def cache(self) -> Any:
        return self.runner.cache

    @property
    def kernels(self) -> Any:
        return self.runner.kernels

    @property
    def dtype(self) -> Any:
        return self.runner.dtype

    @property
    def device(self) -> Any:
        return self.runner.device

    @property
    def nextn(self) -> bool:
        """Whether every rank runs the MTP layer (speculative decoding through :meth:`draft_forward`)."""
        return self.spec.nextn

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

    def _broadcast(self, msg: Any) -> None:
        import torch.distributed as dist

        dist.broadcast_object_list([msg], src=0, group=self.tp.ctrl_group)

    def draft_forward(self, batch: Any, prev_hidden: Any) -> tuple[list[Any], Any]:
        """:meth:`ModelRunner.draft_forward` on every rank (``prev_hidden`` is sent to the workers; under DP
        attention each group runs its sequences' rows): the NextN layer's logits per sequence and its hidden
        states ``[T, D]``, on rank 0."""
        results = self._step(("draft", (batch, prev_hidden.cpu())), batch, draft=prev_hidden)
        return [r[0] for r in results], torch.cat([r[1] for r in results])

    def forward(self, batch: Any, *, hidden: bool = False) -> list[Any] | tuple[list[Any], list[Any]]:
        """One step on every rank; logits per sequence as :meth:`ModelRunner.forward` returns them (with
        ``hidden``, also each sequence's hidden states, as ``(logits, hiddens)``)."""
        results = self._step(("step_hidden" if hidden else "step", batch), batch, hidden=hidden)
        if not hidden:
            return results
        return [r[0] for r in results], [r[1] for r in results]

    def _step(self, msg: Any, batch: Any, *, hidden: bool = False, draft: Any = None) -> list[Any]:
        """Broadcast ``msg``, run this rank's part, gather the groups' results (DP attention): one per sequence."""
        import torch.distributed as dist

        from dsa_runtime.model.batch import build_step

        if self._closed:
            raise WorkerDiedError("the tensor-parallel runtime was shut down")
        self.check_workers()
        cfg = self.runner.config
        # Validate before any rank starts, so a bad batch is one clear error and nobody waits.
        build_step(batch, page_size=self.spec.page_size, num_pages=self.spec.num_pages,
                   vocab_size=cfg.vocab_size, device="cpu")
        try:
            self._broadcast(msg)
            result = run_step(self.runner, self.tp, batch, hidden=hidden, draft=draft)
            if self.parallel.dp > 1:
                # Rank 0 keeps its group's results where they are and sends None: gather_object pickles the
                # root's own input too, and its logits are CUDA row views of the step's [T, V] logits, whose
                # whole storage pickling copies device -> host -> device once per sequence (measured on 2 H200s
                # at 19 layers, 100 requests: a tp 2 dp 2 decode step 304 ms against tp 2's 83 ms).
                parts: list[Any] = [None] * self.parallel.tp
                dist.gather_object(None, parts, dst=0, group=self.tp.ctrl_group)
                for part in parts:
                    for i, v in (part or {}).items():
                        result[i] = _to_device(v, self.tp.device)
        except Exception as exc:
            self._closed = True
            self._kill()
            raise self._died(exc) from exc
        return [result[i] for i in range(len(batch.seqs))]

    def collect(self, fn: str) -> list[Any]:
        """``fn(runner)`` (a ``"module:function"`` name) on every rank, in rank order (tests, diagnostics)."""
        import torch.distributed as dist

        from dsa_runtime.backend import load_object

        self.check_workers()
        self._broadcast(("call", fn))
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
                self._broadcast(STOP)
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


def memory_stats(runner: Any) -> dict[str, int]:
    """This rank's device memory in bytes (for ``DistributedRunner.collect``): weights loaded, KV cache, and on
    CUDA the allocator's allocated / peak allocated / reserved bytes and the device's total."""
    out = {"weights": loaded_bytes(runner), "kv_cache": int(getattr(runner.cache, "total_bytes", 0))}
    dev = torch.device(runner.device)
    if dev.type == "cuda":
        out.update(allocated=torch.cuda.memory_allocated(dev), peak=torch.cuda.max_memory_allocated(dev),
                   reserved=torch.cuda.memory_reserved(dev), total=torch.cuda.get_device_properties(dev).total_memory)
    return out
