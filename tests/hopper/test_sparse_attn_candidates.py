"""The sparse MLA launch-shape table (plugins/cuda_hopper/triton/sparse_attn_candidates.py): every default and
sweep candidate names a known kernel variant with a shape that variant accepts, and ``default_config`` on the GPU
path returns exactly the table's entries (flipping a default is a one-line edit there)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from dsa_runtime.plugins.cuda_hopper.triton import mla_fp8_decode, sparse_attn_candidates, sparse_mla_prefill  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.sparse_attn_candidates import (  # noqa: E402
    BF16_CANDIDATES,
    BF16_DEFAULTS,
    FP8_CANDIDATES,
    FP8_DEFAULTS,
)


def _bf16_ok(cfg) -> bool:
    dv_ok = {"plain": cfg.block_dv in (64, 128, 256, 512), "pipe": cfg.block_dv in (256, 512),
             "pipew": cfg.block_dv == 512}
    return cfg.variant in dv_ok and dv_ok[cfg.variant] and cfg.block_h in (16, 32, 64) and cfg.block_n >= 16


def test_every_bf16_default_and_candidate_is_a_valid_shape():
    configs = [c for d in BF16_DEFAULTS.values() for c in d.values()] + [c for cs in BF16_CANDIDATES.values() for c in cs]
    bad = [c for c in configs if not _bf16_ok(c)]
    assert not bad, bad
    assert set(BF16_DEFAULTS) == {"prefill", "decode"} and all(set(d) == {16, 32, 64} for d in BF16_DEFAULTS.values())


def test_every_fp8_default_and_candidate_names_a_kernel():
    kernels = mla_fp8_decode._kernels()
    configs = [*FP8_DEFAULTS.values(), *(c for cs in FP8_CANDIDATES.values() for c in cs)]
    assert all(c.variant in kernels and c.block_h in (16, 32, 64) and c.block_n >= 16 for c in configs), configs
    assert set(FP8_DEFAULTS) == {16, 32, 64}


def test_gpu_defaults_come_from_the_table(monkeypatch):
    monkeypatch.setattr(sparse_mla_prefill, "INTERPRET", False)
    monkeypatch.setattr(mla_fp8_decode, "INTERPRET", False)
    for heads, tile in ((128, 64), (64, 64), (20, 32), (16, 16), (1, 16)):
        for kind in ("prefill", "decode"):
            assert sparse_mla_prefill.default_config(heads, torch.bfloat16, kind) is BF16_DEFAULTS[kind][tile]
        assert mla_fp8_decode.default_config(heads) is FP8_DEFAULTS[tile]
    flipped = sparse_mla_prefill.AttnConfig(64, 16, 512, 8, 6, "pipe")
    monkeypatch.setitem(sparse_attn_candidates.BF16_DEFAULTS["decode"], 64, flipped)
    assert sparse_mla_prefill.default_config(128, torch.bfloat16, "decode") is flipped


def test_a_bad_variant_is_refused_with_a_clear_error():
    q = torch.zeros(1, 4, 576, dtype=torch.bfloat16)
    kv = torch.zeros(8, 576, dtype=torch.bfloat16)
    idx = torch.zeros(1, 16, dtype=torch.int32)
    for cfg, words in ((sparse_mla_prefill.AttnConfig(variant="nope"), "unknown sparse MLA kernel variant"),
                       (sparse_mla_prefill.AttnConfig(block_dv=128, variant="pipe"), "block_dv 256 or 512"),
                       (sparse_mla_prefill.AttnConfig(block_dv=256, variant="pipew"), "block_dv 512")):
        with pytest.raises(ValueError, match=words):
            sparse_mla_prefill.sparse_mla_forward(q, kv, idx, 0.1, config=cfg)
    with pytest.raises(ValueError, match="unknown fp8 decode variant"):
        mla_fp8_decode.decode_fp8_656(torch.zeros(1, 1, 4, 576, dtype=torch.bfloat16),
                                      torch.zeros(1, 64, 656, dtype=torch.uint8), torch.zeros(1, 1, 16, dtype=torch.int32),
                                      0.1, config=mla_fp8_decode.DecodeConfig(variant="nope"))
