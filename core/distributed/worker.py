"""What every rank of the SPMD runtime runs (the driver, rank 0's view, is :mod:`dsa_runtime.distributed.runtime`).

:class:`RankSpec` says how a rank builds its runner over its slice of the weights; :func:`worker_main` is a spawned
rank's loop: receive a step's message (``wire.py``: a few int64 tensors, broadcast by rank 0), run its part
(:func:`execute`), until ``stop``. Rank 0 runs the same :func:`execute` in the caller's process. The functions at
the end are what ``DistributedRunner.collect`` calls on every rank.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

from dsa_runtime.distributed.parallel import ParallelConfig
from dsa_runtime.distributed.wire import OP_CALL, OP_STOP, Message


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
    from dsa_runtime.distributed.sharding import shard_tensors
    from dsa_runtime.model.runner import ModelRunner, kernel_needs
    from dsa_runtime.resolve import KernelConfig, resolve_kernels

    for name in spec.setup:
        load_object(name)()  # type: ignore[operator]
    info = tp.info
    if spec.model_path is not None:
        from dsa_runtime.loader.overrides import override_checkpoint_config

        part = load_rank_checkpoint(spec.model_path, info, with_tokenizer=False, mtp=spec.nextn)
        config, tensors = part.config, part.tensors
        config = override_checkpoint_config(spec.model_path, config, spec.config_overrides)
    elif spec.tensors is not None:
        config = spec.config
        tensors = shard_tensors(spec.tensors, info, config.num_hidden_layers, mtp=spec.nextn)
    else:
        if spec.nextn:
            raise ValueError("random TP weights have no MTP layer: speculative decoding needs model_path or tensors")
        from dsa_runtime.distributed.random_weights import rank_random_state

        config = spec.config
        tensors = rank_random_state(config, info, tp.device, spec.random_seed or 0, fp8=spec.random_fp8)
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


def send(tp: Any, msg: Message) -> None:
    """Broadcast ``msg`` to the workers (none with one rank: rank 0 runs the message itself)."""
    import torch.distributed as dist

    if tp.info.world == 1:
        return
    header, payload = msg.encode(tp.info.dp)
    dist.broadcast(header, src=0, group=tp.ctrl_group)
    if payload.numel():
        dist.broadcast(payload, src=0, group=tp.ctrl_group)


def receive(tp: Any) -> Message:
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


def _watch_parent(lifeline: Any) -> None:
    """Exit when the process that started this worker is gone (no orphan waiting forever): it holds the other
    end of ``lifeline`` and never writes, so a read returns only when that end closes. (Not the parent pid: under
    a fork server the parent is the server, not the process that asked for the worker.)"""
    with contextlib.suppress(EOFError, OSError):
        lifeline.recv()
    os._exit(3)


def worker_main(local_rank: int, parallel: ParallelConfig, spec: RankSpec, method: str, lifeline: Any) -> None:
    """Entry of a worker process: init the groups, build the runner, then serve steps until ``stop``; exits when
    the process that started it closes ``lifeline`` (its receiving end here)."""
    import torch.distributed as dist

    from dsa_runtime.distributed.comm import init_groups

    threading.Thread(target=_watch_parent, args=(lifeline,), daemon=True).start()
    rank = parallel.node_rank * parallel.ranks_per_node + local_rank
    if spec.cpu_threads:
        torch.set_num_threads(spec.cpu_threads)
    device = torch.device(f"cuda:{local_rank}") if spec.device_type == "cuda" else torch.device("cpu")
    try:
        tp = init_groups(parallel, rank, device, method)
        runner = build_rank_runner(spec, tp)
        while True:
            msg = receive(tp)
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


def start_workers(local_ranks: Any, parallel: ParallelConfig, spec: RankSpec, method: str, *,
                  daemon: bool = True) -> tuple[list[Any], Any]:
    """Start :func:`worker_main` for each of ``local_ranks``; returns the processes and the lifeline's write end,
    which the caller keeps open while it lives (closing it, or dying, stops every worker it started)."""
    from dsa_runtime.processes import context, start

    ctx = context()
    watched, lifeline = ctx.Pipe(duplex=False)
    procs = [start(worker_main, local, parallel, spec, method, watched, ctx=ctx, daemon=daemon)
             for local in local_ranks]
    watched.close()
    return procs, lifeline


def serve_worker_node(parallel: ParallelConfig, spec: RankSpec) -> int:
    """Multi-node: run this node's ranks (``--node-rank`` > 0) until node 0 stops them; exit code."""
    procs, lifeline = start_workers(range(parallel.ranks_per_node), parallel, spec, init_method(parallel),
                                    daemon=False)
    for p in procs:
        p.join()
    bad = [p.exitcode for p in procs if p.exitcode]
    lifeline.close()
    return 1 if bad else 0


def loaded_bytes(runner: Any) -> int:
    """Bytes of weights this rank loaded (for ``DistributedRunner.collect``)."""
    return runner.bytes_loaded


def ep_tokens(runner: Any) -> int:
    """Token rows this rank's experts received so far, over its MoE layers (for ``DistributedRunner.collect``)."""
    counts = [layer.ffn.tokens_received for layer in runner.model.layers if layer.ffn.ep is not None]
    return int(torch.stack(counts).sum()) if counts else 0


def memory_stats(runner: Any) -> dict[str, int]:
    """This rank's device memory in bytes (for ``DistributedRunner.collect``): weights loaded, KV cache, and on
    CUDA the allocator's allocated / peak allocated / reserved bytes and the device's total."""
    out = {"weights": loaded_bytes(runner), "kv_cache": runner.cache.total_bytes}
    dev = torch.device(runner.device)
    if dev.type == "cuda":
        out.update(allocated=torch.cuda.memory_allocated(dev), peak=torch.cuda.max_memory_allocated(dev),
                   reserved=torch.cuda.memory_reserved(dev), total=torch.cuda.get_device_properties(dev).total_memory)
    return out
