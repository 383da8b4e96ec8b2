"""The loader's on-disk checkpoint feeds the runner unchanged: names, FP8 scales and the MTP layer agree."""

from __future__ import annotations

import torch

from dsa_runtime.cache import KVCache
from dsa_runtime.loader.checkpoint import load_checkpoint
from dsa_runtime.loader.make_checkpoint import make_checkpoint
from dsa_runtime.model.runner import ModelRunner
from dsa_runtime.model.seqs import ForwardBatch, ForwardSeq, forward
from tests.model.helpers import kernels, tokens


def test_runner_from_a_generated_checkpoint(tmp_path):
    ckpt = load_checkpoint(make_checkpoint(tmp_path / "ckpt", "tiny-v32", seed=3), progress=False)
    cache = KVCache(ckpt.config, 8, 64, "fp8_656")
    runner = ModelRunner.from_checkpoint(ckpt, kernels=kernels("fp8_656", ckpt.config, 64), cache=cache)
    assert runner.dtype == torch.bfloat16
    assert set(runner.mtp_tensors) == set(ckpt.mtp_tensors) and runner.mtp_tensors
    ids = tokens(40, seed=5)
    prefill, decode = forward(runner, ForwardBatch([ForwardSeq(ids, 0, [1], "last"), ForwardSeq(ids[:1], 0, [2])]))
    assert prefill.shape == decode.shape == (ckpt.config.vocab_size,)
    assert torch.isfinite(prefill).all() and torch.isfinite(decode).all()
