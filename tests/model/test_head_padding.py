"""Head and k padding in the core: a sparse-attention backend that claims only 64 heads (and k multiples of
128 / 64, FlashMLA's shapes) serves the tiny models (4 heads, k 32) through the caller's padding, and the
logits equal the unpadded reference run."""

from __future__ import annotations

import logging

import pytest
import torch

from dsa_runtime.backend import Backend
from dsa_runtime.cache import KVCache
from dsa_runtime.capabilities import Capabilities, MethodClaim, ValueSet
from dsa_runtime.model.runner import ModelRunner, kernel_needs
from dsa_runtime.model.seqs import ForwardBatch, ForwardSeq, forward
from dsa_runtime.padding import PaddedSparseAttn
from dsa_runtime.reference.sparse_attn import ReferenceSparseAttn
from dsa_runtime.resolve import KernelConfig, resolve_kernels
from tests.core.test_resolve import manager_with
from tests.model.helpers import PAGE_SIZE, pages, preset, tokens, weights

CALLS: list[tuple[str, int, int]] = []


class Only64Heads(ReferenceSparseAttn):
    """The reference kernel, refusing (like FlashMLA would crash on) any shape it does not claim."""

    def prefill(self, q, kv, indices, sm_scale, d_v=512):
        assert q.shape[1] == 64 and indices.shape[-1] % 128 == 0, (q.shape, indices.shape)
        CALLS.append(("prefill", q.shape[1], indices.shape[-1]))
        return super().prefill(q, kv, indices, sm_scale, d_v)

    def decode(self, q, kv_cache, indices, sm_scale, *, layout, d_v=512):
        assert q.shape[2] == 64 and indices.shape[-1] % 64 == 0, (q.shape, indices.shape)
        CALLS.append(("decode", q.shape[2], indices.shape[-1]))
        return super().decode(q, kv_cache, indices, sm_scale, layout=layout, d_v=d_v)


def only64_backend() -> Backend:
    return Backend(
        name="only64",
        capabilities=Capabilities(devices=frozenset({"cpu"}), methods={
            "sparse_attn.prefill": MethodClaim(heads=ValueSet.one_of(64), k=ValueSet.multiples(128, 128, 16384)),
            "sparse_attn.decode": MethodClaim(heads=ValueSet.one_of(64), k=ValueSet.multiples(64, 64, 16384)),
        }),
        kernels={"sparse_attn": Only64Heads},
    )


def _padded_runner(name: str, kv_layout: str = "bf16", sparse_attn: str = "only64") -> ModelRunner:
    """only64 (the reference kernel behind a 64-heads-only claim), or the same kernel unpadded."""
    config = preset(name)
    kernels = resolve_kernels(KernelConfig(platform="cpu", kv_layout=kv_layout, sparse_attn=sparse_attn),
                              manager=manager_with(only64_backend()), needs=kernel_needs(config, PAGE_SIZE))
    cache = KVCache(config, 48, PAGE_SIZE, kv_layout, "cpu", torch.float32)
    cache.poison()
    return ModelRunner(config, weights(name), kernels=kernels, cache=cache, dtype=torch.float32, mha_max_keys=0)


def test_resolution_accepts_and_logs_the_padding(caplog):
    caplog.set_level(logging.INFO, logger="dsa_runtime.resolve")
    runner = _padded_runner("tiny-v32")
    choices = runner.kernels.choices
    assert choices["sparse_attn.prefill"].backend == "only64"
    assert choices["sparse_attn.prefill"].reason == "chosen for sparse_attn; pads heads 4 -> 64, k 32 -> 128"
    assert choices["sparse_attn.decode"].reason == "chosen for sparse_attn; pads heads 4 -> 64, k 32 -> 64"
    assert isinstance(runner.kernels.sparse_attn.prefill, PaddedSparseAttn)
    assert any("sparse_attn.decode -> only64" in r.getMessage() and "pads heads 4 -> 64" in r.getMessage()
               for r in caplog.records)
    # The reference claims everything: it is bound directly, unwrapped.
    plain = resolve_kernels(KernelConfig(platform="cpu"), needs=kernel_needs(preset("tiny-v32"), PAGE_SIZE))
    assert not isinstance(plain.sparse_attn.prefill, PaddedSparseAttn)


@pytest.mark.parametrize("name,kv_layout", [("tiny-v32", "bf16"), ("tiny-v32", "fp8_656"), ("tiny-v3", "bf16")])
def test_only_64_heads_backend_equals_unpadded_reference(name, kv_layout):
    """Prefill (absorbed, sparse past index_topk), a continued chunk and decodes, batched and ragged."""
    padded = _padded_runner(name, kv_layout)
    plain = _padded_runner(name, kv_layout, sparse_attn="reference")
    a, b = tokens(45, seed=3), tokens(9, seed=4)
    ta, tb = pages(1, 64), pages(10, 64)
    steps = [
        [ForwardSeq(a[:40], 0, ta, "all"), ForwardSeq(b[:7], 0, tb, "all")],
        [ForwardSeq(a[40:43], 40, ta, "all"), ForwardSeq([b[7]], 7, tb, "last")],  # chunk + dense decode
        [ForwardSeq([a[43]], 43, ta, "last"), ForwardSeq([b[8]], 8, tb, "last")],  # sparse + dense decode
    ]
    CALLS.clear()
    for step in steps:
        got = forward(padded, ForwardBatch(step))
        want = forward(plain, ForwardBatch(step))
        for g, w in zip(got, want, strict=True):
            assert torch.isfinite(g).all()
            # Heads never mix inside the kernel: the kept heads are the same computation (fp32 model).
            torch.testing.assert_close(g, w, rtol=0, atol=1e-4)
    kinds = {c[0] for c in CALLS}
    assert kinds == {"prefill", "decode"} and all(c[1] == 64 for c in CALLS)


def test_padding_refuses_a_shape_no_claim_fits():
    claim = MethodClaim(heads=ValueSet.one_of(64, 128), k=ValueSet.multiples(128, 128, 256))
    fn = PaddedSparseAttn(ReferenceSparseAttn().prefill, "sparse_attn.prefill", claim)
    q = torch.randn(3, 130, 576).bfloat16()
    with pytest.raises(ValueError, match="head count 130 cannot be padded"):
        fn(q, torch.randn(8, 576).bfloat16(), torch.zeros(3, 128, dtype=torch.int32), 0.1)
    with pytest.raises(ValueError, match="k 300 cannot be padded"):
        fn(q[:, :64], torch.randn(8, 576).bfloat16(), torch.zeros(3, 300, dtype=torch.int32), 0.1)
