"""Head padding under TP, a DP attention step whose rows pad 7 -> 8, and a dead worker stopping the service."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from dsa_runtime.distributed import ParallelConfig
from dsa_runtime.distributed.runtime import DistributedRunner, WorkerDiedError
from dsa_runtime.distributed.worker import RankSpec
from dsa_runtime.model.seqs import ForwardBatch, ForwardSeq, forward
from dsa_runtime.resolve import KernelConfig
from tests.distributed.conftest import NUM_PAGES, PAGE, reference_runner
from tests.model.helpers import tokens

ATOL = 5e-2


def _spec(path, **kw) -> RankSpec:
    return RankSpec(model_path=str(path), dtype="float32", num_pages=NUM_PAGES, page_size=PAGE, **kw)


def _run(runner, steps):
    try:
        return [forward(runner, ForwardBatch(step)) for step in steps], runner.collect(
            "tests.distributed.hooks:sparse_reasons")
    finally:
        runner.shutdown()


def test_only_64_heads_backend_under_tp2_equals_unpadded(tiny_checkpoint):
    """tiny-v32 has 4 heads: 2 per rank on tp 2, padded to 64 for a backend claiming only 64 heads; the
    same tp 2 run with the reference kernels (2 heads, unpadded) is the comparison."""
    a, b = tokens(36, 21), tokens(6, 22)
    steps = [[ForwardSeq(a, 0, [1, 2, 3], "all"), ForwardSeq(b, 0, [6, 7], "all")],
             [ForwardSeq([a[0]], 36, [1, 2, 3], "last"), ForwardSeq([b[0]], 6, [6, 7], "last")]]
    padded_spec = _spec(tiny_checkpoint, setup=["tests.distributed.hooks:register_only64"],
                        kernel_config=KernelConfig(platform="cpu", sparse_attn="only64"), mha_max_keys=0)
    padded, reasons = _run(DistributedRunner(ParallelConfig(tp=2, timeout_s=60), padded_spec), steps)
    assert all("pads heads 2 -> 64, k 32 -> 128" in r for r in reasons), reasons
    # The same kernel unpadded: the reference (only64 is the reference behind a 64-heads-only claim).
    plain_spec = _spec(tiny_checkpoint, mha_max_keys=0,
                       kernel_config=KernelConfig(platform="cpu", sparse_attn="reference"))
    plain, reasons = _run(DistributedRunner(ParallelConfig(tp=2, timeout_s=60), plain_spec), steps)
    assert not any("pads" in r for r in reasons)
    for got_step, want_step in zip(padded, plain, strict=True):
        for got, want in zip(got_step, want_step, strict=True):
            # The padded call may round its bf16 output one ulp apart (fp32 sums in another order): measured
            # max 0.007 on logits of scale ~4; a wrong head or a padded head leaking in is O(1).
            torch.testing.assert_close(got, want, rtol=0, atol=2e-2)


def test_dp_attention_step_padded_7_to_8(tiny_checkpoint, monkeypatch):
    """tp 4 dp 2: group 0 serves 7 tokens, group 1 five; both run 7 rows (group 1 two null rows) and pad to 8
    for the MoE gather. The step reaches the workers as int64 tensors and group 1's logits come back as one
    tensor: no pickled object travels (rank 0 never calls an object collective)."""
    import torch.distributed as dist

    sent: list = []

    def refuse(*args, **kwargs):
        raise AssertionError("a step sent a pickled object")

    real_broadcast = dist.broadcast

    def broadcast(tensor, *args, **kwargs):
        sent.append(tensor.dtype)
        return real_broadcast(tensor, *args, **kwargs)

    runner = DistributedRunner(ParallelConfig(tp=4, dp=2, enable_dp_attention=True, timeout_s=60),
                               _spec(tiny_checkpoint))
    for name in ("gather_object", "broadcast_object_list", "send_object_list", "scatter_object_list"):
        monkeypatch.setattr(dist, name, refuse)
    monkeypatch.setattr(dist, "broadcast", broadcast)
    ref = reference_runner(tiny_checkpoint)
    try:
        seqs = [ForwardSeq(tokens(7, 31), 0, [2], "all"), ForwardSeq(tokens(5, 32), 0, [3], "all")]
        for got, want in zip(forward(runner, ForwardBatch(seqs)), forward(ref, ForwardBatch(seqs)), strict=True):
            assert got.shape == want.shape and float((got - want).abs().max()) <= ATOL
        assert sent == [torch.int64, torch.int64]  # the header and the payload
        # One group idle (every sequence on group 0): it runs a null row and joins the FFN collectives.
        one = [ForwardSeq([3], 7, [2], "last")]
        got, want = forward(runner, ForwardBatch(one))[0], forward(ref, ForwardBatch(one))[0]
        assert float((got - want).abs().max()) <= ATOL
        # A malformed batch is one clear error on rank 0, and the service goes on.
        with pytest.raises(ValueError, match="page ids must be in"):
            forward(runner, ForwardBatch([ForwardSeq([1], 0, [0])]))
        got = forward(runner, ForwardBatch([ForwardSeq([4], 8, [2], "last")]))[0]
        assert torch.isfinite(got).all()
    finally:
        runner.shutdown()


def test_dead_worker_stops_the_service_with_a_clear_error(tiny_checkpoint):
    runner = DistributedRunner(ParallelConfig(tp=2, timeout_s=20), _spec(tiny_checkpoint))
    try:
        forward(runner, ForwardBatch([ForwardSeq(tokens(4, 41), 0, [1])]))
        os.kill(runner.procs[0].pid, signal.SIGKILL)
        runner.procs[0].join(timeout=10)
        t0 = time.monotonic()
        with pytest.raises(WorkerDiedError, match=r"worker rank 1 \(pid \d+\) exited with code -9"):
            forward(runner, ForwardBatch([ForwardSeq([5], 4, [1])]))
        assert time.monotonic() - t0 < 5
        with pytest.raises(WorkerDiedError):
            forward(runner, ForwardBatch([ForwardSeq([5], 4, [1])]))
    finally:
        runner.shutdown()


def test_random_weights_built_per_rank_equal_tp1():
    """RankSpec(random_seed=...): every rank draws the same full tensors and keeps its slice."""
    from dsa_runtime.cache import KVCache
    from dsa_runtime.distributed import RankInfo
    from dsa_runtime.distributed.random_weights import rank_random_state
    from dsa_runtime.model.runner import ModelRunner
    from tests.model.helpers import kernels, preset

    config = preset("tiny-v32")
    full = rank_random_state(config, RankInfo(0, 1, 1, 1), "cpu", seed=6)
    assert all(not k.startswith(f"model.layers.{config.num_hidden_layers}.") for k in full)
    ref = ModelRunner(config, full, kernels=kernels("bf16", config, PAGE),
                      cache=KVCache(config, NUM_PAGES, PAGE, "bf16", "cpu", torch.float32), dtype=torch.float32)
    spec = RankSpec(config=config, random_seed=6, dtype="float32", num_pages=NUM_PAGES, page_size=PAGE)
    runner = DistributedRunner(ParallelConfig(tp=2, timeout_s=60), spec)
    try:
        seqs = [ForwardSeq(tokens(12, 51), 0, [1], "all"), ForwardSeq(tokens(3, 52), 0, [2], "all")]
        rows = torch.cat([(g - w).abs().amax(-1) for g, w in zip(forward(runner, ForwardBatch(seqs)),
                                                                  forward(ref, ForwardBatch(seqs)), strict=True)])
        # bf16 random weights: the MoE router can flip a near-tied expert for one token between TP degrees
        # (seed 5 flips row 8: 2.16); a wrong slice would move every row.
        assert int((rows > ATOL).sum()) <= 1 and float(rows.median()) <= ATOL / 4, rows
        assert sum(runner.collect("dsa_runtime.distributed.worker:loaded_bytes")) > 0
    finally:
        runner.shutdown()


_NODE1 = f"""
import sys
from dsa_runtime.distributed import ParallelConfig
from dsa_runtime.distributed.worker import RankSpec, serve_worker_node
path, addr = sys.argv[1], sys.argv[2]
spec = RankSpec(model_path=path, dtype="float32", num_pages={NUM_PAGES}, page_size={PAGE})
sys.exit(serve_worker_node(ParallelConfig(tp=2, nnodes=2, node_rank=1, dist_init_addr=addr, timeout_s=20), spec))
"""


def test_two_nodes_on_localhost(tiny_checkpoint):
    """--nnodes 2: node 1 runs rank 1 only (a separate process tree), node 0 the scheduler side; a lost
    node is an error on the next step, not a hang."""
    import subprocess
    import sys

    from dsa_runtime.distributed.worker import free_port

    addr = f"127.0.0.1:{free_port()}"
    node1 = subprocess.Popen([sys.executable, "-c", _NODE1, str(tiny_checkpoint), addr])
    try:
        parallel = ParallelConfig(tp=2, nnodes=2, node_rank=0, dist_init_addr=addr, timeout_s=20)
        runner = DistributedRunner(parallel, _spec(tiny_checkpoint))
        assert runner.procs == []  # no local workers: rank 1 lives on node 1
        ref = reference_runner(tiny_checkpoint)
        seqs = [ForwardSeq(tokens(9, 61), 0, [1], "all"), ForwardSeq(tokens(4, 62), 0, [2], "all")]
        for got, want in zip(forward(runner, ForwardBatch(seqs)), forward(ref, ForwardBatch(seqs)), strict=True):
            assert float((got - want).abs().max()) <= ATOL
        runner.shutdown()
        assert node1.wait(timeout=30) == 0
        # A lost node: the next step fails with a clear error within the collective timeout.
        addr = f"127.0.0.1:{free_port()}"
        node1 = subprocess.Popen([sys.executable, "-c", _NODE1, str(tiny_checkpoint), addr])
        runner = DistributedRunner(ParallelConfig(tp=2, nnodes=2, node_rank=0, dist_init_addr=addr, timeout_s=20),
                                   _spec(tiny_checkpoint))
        node1.kill()
        node1.wait(timeout=10)
        time.sleep(1.5)  # its rank process notices the node process is gone (0.5 s watch) and exits
        t0 = time.monotonic()
        with pytest.raises(WorkerDiedError, match="a peer rank is gone or stuck"):
            forward(runner, ForwardBatch(seqs))
        assert time.monotonic() - t0 < 25
        runner.shutdown()
    finally:
        if node1.poll() is None:
            node1.kill()


def test_dense_v3_family_under_tp4_dp2_from_memory():
    """tiny-v3 (no indexer, dense MLA through the sparse kernels) from an in-memory state dict."""
    from tests.model.helpers import make_runner, pages, preset, weights

    spec = RankSpec(tensors=weights("tiny-v3"), config=preset("tiny-v3"), dtype="float32", num_pages=48,
                    page_size=16)
    runner = DistributedRunner(ParallelConfig(tp=4, dp=2, enable_dp_attention=True, timeout_s=60), spec)
    ref = make_runner("tiny-v3", poison=False)
    try:
        steps = [[ForwardSeq(tokens(40, 71), 0, pages(1, 48), "all"), ForwardSeq(tokens(7, 72), 0, pages(4, 48), "all")],
                 [ForwardSeq([5], 40, pages(1, 48), "last"), ForwardSeq([6], 7, pages(4, 48), "last")]]
        for step in steps:
            for got, want in zip(forward(runner, ForwardBatch(step)), forward(ref, ForwardBatch(step)), strict=True):
                assert float((got - want).abs().max()) <= ATOL
    finally:
        runner.shutdown()
