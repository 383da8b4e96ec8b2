"""Random FP8 weights per rank (``rank_random_state(..., fp8=True)``, the full-size benchmark's weights)."""

from __future__ import annotations

import copy

import pytest
import torch

from dsa_runtime.distributed import RankInfo
from dsa_runtime.distributed.random_weights import rank_random_state
from dsa_runtime.distributed.sharding import SCALE_SUFFIX
from dsa_runtime.model.config import ModelConfig
from dsa_runtime.reference.fp8 import block_dequant_weight


@pytest.fixture(scope="module")
def config() -> ModelConfig:
    from dsa_runtime.loader.presets import preset_config

    raw = copy.deepcopy(preset_config("tiny-v32"))
    raw["num_nextn_predict_layers"] = 0
    raw["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                                  "scale_fmt": "ue8m0"}
    return ModelConfig.from_hf(raw)


def test_fp8_linears_are_block_scaled_with_unit_rms_rows(config):
    full = rank_random_state(config, RankInfo(0, 1, 1, 1), "cpu", seed=3, fp8=True)
    fp8 = [n for n, t in full.items() if t.dtype == torch.float8_e4m3fn]
    assert fp8 and all(f"{n}{SCALE_SUFFIX}" in full for n in fp8)
    name = next(n for n in fp8 if ".mlp.experts.0.down_proj" in n)
    w = block_dequant_weight(full[name], full[f"{name}{SCALE_SUFFIX}"])
    fan_in = w.shape[-1]
    # N(0, 1/fan_in) before quantisation: e4m3 keeps the std within a few percent
    assert abs(float(w.std()) * fan_in**0.5 - 1.0) < 0.05
    scale = full[f"{name}{SCALE_SUFFIX}"]
    assert torch.equal(scale, torch.exp2(torch.log2(scale).round()))  # ue8m0: powers of two
    # bf16 draw of the same name and seed: the FP8 weight is its quantisation, not another draw
    bf16 = rank_random_state(config, RankInfo(0, 1, 1, 1), "cpu", seed=3)[name].float()
    assert float((w - bf16).abs().max()) <= float(bf16.abs().max()) / 8


def test_fp8_rank_slices_are_slices_of_the_full_model(config):
    full = rank_random_state(config, RankInfo(0, 1, 1, 1), "cpu", seed=4, fp8=True)
    rank1 = rank_random_state(config, RankInfo(1, 2, 2, 1), "cpu", seed=4, fp8=True)
    assert set(rank1) <= set(full)
    split = [n for n, t in rank1.items() if t.shape != full[n].shape]
    assert split, "tp 2 split nothing"
    kept_fp8 = dequantised = 0
    for name in split:
        t, f = rank1[name], full[name]
        if name.endswith(SCALE_SUFFIX):
            continue  # checked with their weights: a wrong scale slice breaks the dequantised comparison below
        if t.dtype != f.dtype:  # a slice cutting 128-blocks is dequantised at load (sharding._slice_fp8)
            f = block_dequant_weight(f, full[f"{name}{SCALE_SUFFIX}"]).to(t.dtype)
            dequantised += 1
        elif f.dtype == torch.float8_e4m3fn:
            t = block_dequant_weight(t, rank1[f"{name}{SCALE_SUFFIX}"])
            f = block_dequant_weight(f, full[f"{name}{SCALE_SUFFIX}"])
            kept_fp8 += 1
        dim = next(d for d in range(t.dim()) if t.shape[d] != f.shape[d])
        assert torch.equal(t, f.narrow(dim, f.shape[dim] - t.shape[dim], t.shape[dim])), name  # rank 1: 2nd half
    assert kept_fp8 + dequantised > 0


def test_release_tensors_empties_the_dict_and_builds_the_same_model(config):
    """ModelRunner(release_tensors=True) frees each source tensor as it is built, and builds the same weights."""
    from dsa_runtime.cache import KVCache
    from tests.model.helpers import kernels

    full = rank_random_state(config, RankInfo(0, 1, 1, 1), "cpu", seed=5, fp8=True)
    built = {}
    for release in (False, True):
        tensors = dict(full)
        from dsa_runtime.model.runner import ModelRunner

        runner = ModelRunner(config, tensors, kernels=kernels("bf16", config, 16),
                             cache=KVCache(config, 8, 16, "bf16", "cpu", torch.float32), dtype=torch.float32,
                             release_tensors=release)
        assert (len(tensors) == 0) == release
        layer = runner.model.layers[-1].ffn.experts
        built[release] = (layer.w13, layer.w2, runner.model.head)
    assert all(torch.equal(a, b) for a, b in zip(built[False], built[True], strict=True))
