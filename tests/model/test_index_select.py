"""Chunked indexer logits + top-k: identical indices to the unchunked call, and a 64K-token ragged prefill
within a small memory budget (peak RSS measured in a fresh process).

Chunking cannot change an index when the backend computes each row's logits independently of the other rows
of the call (the reference; tile-based GPU kernels). The ``torch`` CPU backend's batched GEMM may round a
row differently for another row count, which can flip a near-tied key: these tests pin the reference indexer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from dsa_runtime.model.index_select import select_topk_ragged
from dsa_runtime.model.seqs import ForwardBatch, ForwardSeq, forward
from tests.model.helpers import make_runner, pages, tokens


def reference_kernels():
    from dsa_runtime.resolve import KernelConfig, resolve_kernels

    return resolve_kernels(KernelConfig(platform="cpu", indexer="reference", topk="reference"))


def ragged_inputs(lengths: list[int], heads: int, seed: int):
    """Random indexer queries / keys of a ragged batch: row t of sequence i sees its own keys up to itself.
    Built one sequence at a time, so that making them needs little memory beyond the inputs."""
    ref = reference_kernels()
    g = torch.Generator().manual_seed(seed)
    q8s, ws, k8s, scales = [], [], [], []
    for n in lengths:
        q8, w = ref.indexer.quantize_q(torch.randn(n, heads, 128, generator=g), torch.randn(n, heads, generator=g))
        k8, k_scale = ref.indexer.quantize_k(torch.randn(n, 128, generator=g))
        q8s.append(q8), ws.append(w), k8s.append(k8), scales.append(k_scale)
    ks, ke, off = [], [], 0
    for n in lengths:
        ks += [off] * n
        ke += list(range(off + 1, off + n + 1))
        off += n
    return (ref, torch.cat(q8s), torch.cat(ws), torch.cat(k8s), torch.cat(scales), torch.tensor(ks),
            torch.tensor(ke))


def test_chunked_equals_unchunked_with_global_offsets():
    ref, q8, w, k8, k_scale, ks, ke = ragged_inputs([300, 517, 1, 1000], heads=4, seed=0)
    want = ref.topk.topk(ref.indexer.logits_ragged(q8, w, k8, k_scale, ks, ke), ks, ke, 64)
    for budget in (1, 200_000, 3 << 20, 1 << 40):  # one row per chunk ... everything in one chunk
        got = select_topk_ragged(ref, q8, w, k8, k_scale, ks, ke, 64, budget_bytes=budget, rows_total=1821)
        assert got.shape == (1821, 64) and got.dtype == torch.int32
        assert torch.equal(got[:1818], want), budget
        assert (got[1818:] == -1).all()  # padded query rows carry -1 rows


def test_rows_of_different_sequences_get_logits_over_their_own_keys():
    """A batched prefill of short chunks over long cached prefixes (each sequence's rows see only its part of
    the concatenated keys): no call's logits span the keys of several long sequences, and the indices equal
    the unchunked call's."""
    ref, q8, w, k8, k_scale, ks, ke = ragged_inputs([700, 650, 40, 900], heads=4, seed=1)
    tail = torch.cat([torch.arange(off + n - 12, off + n) for off, n in ((0, 700), (700, 650), (1350, 40),
                                                                            (1390, 900))])  # last 12 rows each
    q8, w, ks, ke = q8[tail], w[tail], ks[tail], ke[tail]
    want = ref.topk.topk(ref.indexer.logits_ragged(q8, w, k8, k_scale, ks, ke), ks, ke, 32)
    widths: list[int] = []
    inner = ref.indexer.logits_ragged

    def spy(q, weights, keys, *args):
        widths.append(keys.shape[0])
        return inner(q, weights, keys, *args)

    ref.indexer.logits_ragged = spy
    got = select_topk_ragged(ref, q8, w, k8, k_scale, ks, ke, 32, budget_bytes=1 << 40)
    assert torch.equal(got, want)
    # The 40-token sequence shares a call with a neighbour (its keys are under half of the widest window);
    # the three long ones never share one.
    assert len(widths) == 3 and max(widths) <= 1.5 * 900, widths


def test_runner_with_a_tiny_budget_gives_identical_logits():
    big, small = make_runner("tiny-v32", mha_max_keys=0), make_runner("tiny-v32", mha_max_keys=0)
    big.kernels = small.kernels = reference_kernels()
    small.indexer_budget_bytes = 4096  # a chunk of a row or two
    batch = ForwardBatch([ForwardSeq(tokens(45, 5), 0, pages(1, 45), "all"), ForwardSeq(tokens(38, 6), 0, pages(5, 38))])
    for a, b in zip(forward(big, batch), forward(small, batch), strict=True):
        assert torch.equal(a, b)


_SCRIPT = r"""
import ctypes, json, sys, torch
torch.set_num_threads(1)
from dsa_runtime.model.index_select import select_topk_ragged
from tests.model.test_index_select import ragged_inputs

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

lengths, budget, k = json.loads(sys.argv[1])
ref, q8, w, k8, k_scale, ks, ke = ragged_inputs(lengths, heads=2, seed=1)
warm = ragged_inputs([300, 200], heads=2, seed=2)  # first use of each op maps code pages: not workspace
select_topk_ragged(*warm[:7], k, budget_bytes=1 << 20)
del warm
ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed heap back to the system
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
before = status("VmRSS")
out = select_topk_ragged(ref, q8, w, k8, k_scale, ks, ke, k, budget_bytes=budget)
peak = status("VmHWM")
print(json.dumps({"rows": out.shape[0], "extra": peak - before - out.numel() * 4,
                  "valid": int((out >= 0).sum())}))
"""


def _peak_extra(lengths: list[int], budget: int, k: int) -> dict:
    # A fixed mmap threshold: every large buffer is its own mapping, returned on free, so the peak RSS is the
    # peak of live tensors (glibc's dynamic threshold would keep freed chunks in the heap, varying by run).
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    res = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps([lengths, budget, k])], capture_output=True,
                         text=True, timeout=240, check=False, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_64k_token_prefill_stays_within_a_small_budget():
    """64 sequences x 1024 tokens = 65536 rows; unchunked logits would be 16 GiB (64K x 64K fp32)."""
    budget, k = 32 << 20, 128
    got = _peak_extra([1024] * 64, budget, k)
    assert got["rows"] == 65536
    # Row t of a sequence selects min(t + 1, k) keys: 64 * (sum_{t<128} (t+1) + 896 * 128).
    assert got["valid"] == 64 * (128 * 129 // 2 + 896 * 128)
    assert 0 < got["extra"] < budget, f"peak extra memory {got['extra'] / 2**20:.1f} MiB > budget {budget >> 20} MiB"
    # The measurement can fail: 8K rows in one chunk (an unlimited budget) need far more than 32 MiB.
    assert _peak_extra([1024] * 8, 1 << 40, k)["extra"] > budget
