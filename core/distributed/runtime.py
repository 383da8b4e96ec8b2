"""Rank processes in lockstep (SPMD) behind the :class:`~dsa_runtime.model.step.Runner` protocol.

Rank 0 lives in the caller's process (it owns the scheduler, the tokenizer and the sampler); ranks ``1 .. n-1``
of this node are spawned (``torch.multiprocessing``, spawn). Every rank owns a runner over its slice of the
weights, with its own KV cache, request-slot state and captured CUDA graphs (collectives inside them). Each step
rank 0 broadcasts the step's token rows as a few int64 tensors (``wire.py``) and every rank runs its part of the
same step; under DP attention each group runs its own rows and the group leaders send their picked rows' outputs
to rank 0. A worker that dies takes the service down: the watchdog checks the workers before every step and
turns a failed collective into :class:`WorkerDiedError` naming the rank and its exit code; collectives time out
(``ParallelConfig.timeout_s``) instead of hanging, and a worker exits when rank 0's process is gone. What the
other ranks run is :mod:`dsa_runtime.distributed.worker`.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from dsa_runtime.distributed.parallel import ParallelConfig
from dsa_runtime.distributed.wire import OP_CALL, OP_STEP, OP_STOP, Message, lay_out
from dsa_runtime.distributed.worker import (
    RankSpec,
    build_rank_runner,
    execute,
    init_method,
    send,
    start_workers,
)
from dsa_runtime.model.step import Step, StepKind


class WorkerDiedError(RuntimeError):
    """A tensor-parallel worker process is gone; the service cannot go on."""


def _rank0(name: str) -> property:
    return property(lambda self: getattr(self.runner, name), doc=f"rank 0's runner's ``{name}``")


class DistributedRunner:
    """Rank 0's view: a :class:`~dsa_runtime.model.step.Runner` over all ranks.

    Starts the workers of this node (ranks 1 .. ranks_per_node-1), joins the process group as rank 0 and
    builds its own slice. ``shutdown()`` stops the workers (also at interpreter exit). With one rank it runs the
    same code with nobody to send to (``--distributed-executor-backend mp`` at ``--tp 1``).
    """

    def __init__(self, parallel: ParallelConfig, spec: RankSpec) -> None:
        from dsa_runtime.distributed.comm import init_groups

        if parallel.node_rank != 0:
            raise ValueError("the scheduler runs on node 0; other nodes run serve_worker_node()")
        self.parallel, self.spec = parallel, spec
        method = init_method(parallel)
        self.procs, self._lifeline = start_workers(range(1, parallel.ranks_per_node), parallel, spec, method)
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
            send(self.tp, msg)
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
        counts = self.collect("dsa_runtime.distributed.worker:ep_tokens")
        return [sum(counts[q::ep]) for q in range(ep)]

    def collect(self, fn: str) -> list[Any]:
        """``fn(runner)`` (a ``"module:function"`` name) on every rank, in rank order (tests, diagnostics)."""
        import torch.distributed as dist

        from dsa_runtime.backend import load_object

        self.check_workers()
        send(self.tp, Message(OP_CALL))
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
                send(self.tp, Message(OP_STOP))
            for p in self.procs:
                p.join(timeout=10)
        finally:
            self._kill()
            self._lifeline.close()
            if dist.is_initialized():
                dist.destroy_process_group()
