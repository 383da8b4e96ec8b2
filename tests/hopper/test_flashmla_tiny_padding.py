"""A 4-head tiny V3.2 model decodes through ``flashmla_kv``'s exact claims (64/128 heads, k % 64, page 64, FP8
cache): the core's padding turns every decode call into a 64-head call, and the logits equal the reference.

The adapter runs on the stand-in ``flash_mla`` (plain PyTorch with FlashMLA's shape checks), so this checks the
routing and the layout translation on CPU; the GPU run of the real library is the conformance kit's job.
"""

from __future__ import annotations

import sys

import torch

from dsa_runtime.backend import Backend
from dsa_runtime.cache import KVCache
from dsa_runtime.capabilities import Capabilities
from dsa_runtime.model.runner import ModelRunner, kernel_needs
from dsa_runtime.model.seqs import ForwardBatch, ForwardSeq, forward
from dsa_runtime.padding import PaddedSparseAttn
from dsa_runtime.plugins.cuda_hopper.flashmla import DECODE_CLAIMS, FlashMLAKV
from dsa_runtime.resolve import KernelConfig, resolve_kernels
from tests.core.test_resolve import manager_with
from tests.hopper import fake_flash_mla
from tests.model.helpers import pages, preset, tokens, weights

PAGE = 64


def _runner(decode_backend: str) -> ModelRunner:
    config = preset("tiny-v32")
    cpu_kv = Backend(  # flashmla_kv's claims and adapter; only the device differs (the stand-in runs on CPU)
        name="flashmla_kv_cpu", capabilities=Capabilities(devices=frozenset({"cpu"}), methods=DECODE_CLAIMS),
        kernels={"sparse_attn": FlashMLAKV},
    )
    kernels = resolve_kernels(
        KernelConfig(platform="cpu", kv_layout="fp8_656", sparse_attn_decode=decode_backend),
        manager=manager_with(cpu_kv), needs=kernel_needs(config, PAGE),
    )
    cache = KVCache(config, 8, PAGE, "fp8_656", "cpu", torch.bfloat16)
    cache.poison()
    return ModelRunner(config, weights("tiny-v32"), kernels=kernels, cache=cache, dtype=torch.bfloat16, mha_max_keys=0)


def test_tiny_model_decode_pads_to_64_heads_and_equals_the_reference(monkeypatch):
    lib = fake_flash_mla.make()
    monkeypatch.setitem(sys.modules, "flash_mla", lib)
    padded, plain = _runner("flashmla_kv_cpu"), _runner("reference")
    choice = padded.kernels.choices["sparse_attn.decode"]
    assert choice.backend == "flashmla_kv_cpu" and choice.reason.endswith("pads heads 4 -> 64, k 32 -> 64")
    assert isinstance(padded.kernels.sparse_attn.decode, PaddedSparseAttn)
    a, b = tokens(45, seed=5), tokens(38, seed=6)
    ta, tb = pages(1, 64, PAGE), pages(3, 64, PAGE)
    steps = [
        [ForwardSeq(a[:43], 0, ta, "last"), ForwardSeq(b[:36], 0, tb, "last")],
        [ForwardSeq([a[43]], 43, ta, "last"), ForwardSeq([b[36]], 36, tb, "last")],  # sparse decodes (k 32 < len)
        [ForwardSeq([a[44]], 44, ta, "last"), ForwardSeq([b[37]], 37, tb, "last")],
    ]
    for step in steps:
        got, want = forward(padded, ForwardBatch(step)), forward(plain, ForwardBatch(step))
        for g, w in zip(got, want, strict=True):
            assert torch.isfinite(g).all()
            torch.testing.assert_close(g, w, rtol=0, atol=0)  # heads never mix: the kept heads are identical
    decodes = [c for c in lib.calls if c[0] == "decode"]
    assert decodes and all(c[1][2] == 64 and c[3][-1] == 64 and c[2][1:] == (64, 1, 656) for c in decodes)
