"""bench/decode_real_gpu.py without a GPU: the ``--dry-run`` (tiny V3.2 preset on the CPU) writes one row per
case; the on-device weight generator gives exactly the tensors the checkpoint spec and ``random_state_dict``
name, with FP8 scales of powers of two, and ModelRunner loads them; byte counts and case fitting by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dsa_runtime.loader.presets import preset_config
from dsa_runtime.loader.random_init import random_state_dict
from dsa_runtime.loader.spec import expected_tensors
from dsa_runtime.model.config import ModelConfig

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPT = BENCH / "decode_real_gpu.py"


@pytest.fixture
def bench(monkeypatch):
    """The bench modules (``decode_real_setup`` as ``S``, ``decode_real_gpu`` as ``G``)."""
    monkeypatch.syspath_prepend(str(BENCH))
    import decode_real_gpu as G
    import decode_real_setup as S

    return S, G


def _tiny(**changes) -> ModelConfig:
    raw = preset_config("tiny-v32")
    raw.update(changes)
    return ModelConfig.from_hf(raw)


def test_dry_run_writes_a_row_per_case(tmp_path):
    out = tmp_path / "real.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--json", str(out)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["device"] == "cpu (dry run)" and data["copy_gbs"] > 0
    assert data["model"]["layers"] == 3 and data["model"]["dense_layers"] == 1
    assert data["kernels"]["sparse_attn.decode"] and data["memory"]["cache_pages"] == 1 + 3 * 2
    rows = data["rows"]
    assert [(r["batch"], r["context"]) for r in rows] == [(1, 40), (3, 40), (1, 100), (3, 100)]
    for r in rows:
        assert r["fits"] and r["finite"] and not r["graphs"]
        assert r["wall_ms"] > 0 and r["back_to_back_ms"] > 0 and r["kernel_ms"] is None and r["wall_over_kernel"] is None
        assert r["roofline_ms"] > 0 and r["roofline_over_wall"] == pytest.approx(r["roofline_ms"] / r["wall_ms"])
        assert len(r["distinct_experts"]) == 2  # layers 1 and 2 are MoE
        assert all(2 <= d <= min(8, 2 * r["batch"]) for d in r["distinct_experts"])  # top-2 of 8 experts
        b = r["bytes"]
        assert b["total"] == pytest.approx(b["dense_weights"] + b["experts"] + b["kv"] + b["index_k"])
        assert b["kv"] == r["batch"] * 3 * min(r["context"], 32) * 656  # index_topk 32, fp8_656 rows
        assert b["index_k"] == r["batch"] * 3 * r["context"] * 132
    lines = run.stdout.strip().splitlines()
    assert lines[-1] == f"wrote {out}"
    assert lines[-7].startswith("| case |") and lines[-2].startswith("| b3 ctx100 |")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA refusal")
def test_refuses_without_cuda(tmp_path):
    out = tmp_path / "real.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--json", str(out)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip() == "decode_real_gpu: needs a CUDA device (or --dry-run)"
    assert not out.exists()


@pytest.mark.parametrize("pool", [None, 3])
def test_generator_matches_the_spec_and_random_state_dict(bench, pool):
    """Tiny V3.2 with its MTP layer: the same names in the same order, shapes and dtypes as random_state_dict."""
    S, _ = bench
    config = _tiny()
    got = S.random_fp8_state(config, "cpu", seed=3, expert_pool=pool)
    want = random_state_dict(config, seed=0)
    specs = expected_tensors(config, fp8=True)
    assert list(got) == list(want) == list(specs)
    for name, t in got.items():
        assert tuple(t.shape) == tuple(want[name].shape) == specs[name].shape, name
        assert t.dtype == want[name].dtype, name
        assert t.device.type == "cpu"
    shared = got["model.layers.1.mlp.experts.4.down_proj.weight"] is got["model.layers.1.mlp.experts.1.down_proj.weight"]
    assert shared == (pool == 3)


def test_fp8_weights_have_power_of_two_scales_and_unit_gain(bench):
    S, _ = bench
    config = _tiny()
    got = S.random_fp8_state(config, "cpu", seed=5)
    for name in ("model.layers.0.self_attn.o_proj.weight", "model.layers.1.mlp.experts.0.gate_proj.weight",
                 "model.layers.0.mlp.down_proj.weight"):
        w8, scale = got[name], got[f"{name}_scale_inv"]
        assert w8.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
        mantissa, _ = torch.frexp(scale)
        assert (mantissa == 0.5).all(), "ue8m0 scales are powers of two"
        w = w8.float() * scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[: w8.shape[0], : w8.shape[1]]
        assert w.std().item() == pytest.approx(w8.shape[1] ** -0.5, rel=0.1)
        assert w8.float().abs().max() < 448  # no block saturates
    assert got["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == torch.float32
    norm = got["model.layers.0.input_layernorm.weight"].float()
    assert (norm - 1).abs().max() < 0.2


def test_model_runner_loads_the_generated_weights_and_counts_their_bytes(bench):
    """ModelRunner takes the generated tensors (experts FP8, the rest dequantised to bf16); weight_bytes matches
    a count from the spec of what the runner keeps."""
    S, G = bench
    from dsa_runtime.cache import KVCache
    from dsa_runtime.model.runner import ModelRunner

    config = S.dry_config()
    tensors = S.random_fp8_state(config, "cpu", expert_pool=3)
    kernels = G.resolve(config, G.parse_args(["--dry-run"]))
    cache = KVCache(config, 4, 64, kernels.kv_layout, "cpu", torch.bfloat16)
    runner = ModelRunner(config, tensors, kernels=kernels, cache=cache, dtype=torch.bfloat16)
    experts = runner.model.layers[1].ffn.experts
    assert experts.w13.dtype == torch.float8_e4m3fn and experts.w13_scale is not None
    got = S.weight_bytes(runner.model)
    d, i, e = config.hidden_size, config.moe_intermediate_size, config.n_routed_experts
    one_expert = 3 * i * d + 4 * (2 * (-(-2 * i // 128)) * (-(-d // 128)) // 2 + (-(-d // 128)) * (-(-i // 128)))
    assert got["expert"] == [one_expert, one_expert]
    want_dense = 0
    for name, spec in expected_tensors(config, fp8=True).items():
        if ".mlp.experts." in name or name == "model.embed_tokens.weight":
            continue
        shared = ".shared_experts." in name
        if name.endswith("_scale_inv"):
            want_dense += 4 * spec.numel if shared else 0  # dequantised linears keep no scales
        elif spec.kind == "fp8":
            want_dense += spec.numel * (1 if shared else 2)
        elif name.endswith(("mlp.gate.weight", "weights_proj.weight", "k_norm.weight", "k_norm.bias",
                            "e_score_correction_bias", "layernorm.weight")) or name == "model.norm.weight":
            want_dense += 4 * spec.numel  # kept in fp32 (RMSNorm weights: the dtype the norm multiplies in)
        else:
            want_dense += 2 * spec.numel
    assert got["dense"] == want_dense
    assert got["embed_row"] == 2 * d
    assert got["total"] == want_dense + 2 * config.vocab_size * d + 2 * e * one_expert


def test_step_bytes_and_distinct_experts(bench):
    S, _ = bench
    assert S.uniform_distinct_experts(256, 8, 1) == pytest.approx(8)
    assert S.uniform_distinct_experts(256, 8, 128) == pytest.approx(256 * (1 - (31 / 32) ** 128))
    config = S.dry_config()
    weights = {"dense": 1000, "expert": [10, 20], "embed_row": 4}
    got = S.step_bytes(config, weights, batch=2, context=100, kv_layout="bf16", distinct=[3.0, 4.0])
    assert got == {"dense_weights": 1008.0, "experts": 110.0, "kv": 2 * 3 * 32 * 1152.0,
                   "index_k": 2 * 3 * 100 * 132.0, "total": 1118.0 + 2 * 3 * 32 * 1152 + 2 * 3 * 100 * 132}
    assert S.cache_bytes_per_page(config, 64, "fp8_656") == 64 * (656 + 132) * 3


def test_cases_that_do_not_fit_are_left_out_of_the_cache(bench):
    _, G = bench
    cases = [(1, 4096), (128, 4096), (128, 32768)]
    pages, fits = G.fit_cases(cases, 64, bytes_per_page=1000, budget=100 * 1000)
    assert fits == {(1, 4096): True, (128, 4096): False, (128, 32768): False}
    assert pages == 64 + 1
    pages, fits = G.fit_cases(cases, 64, bytes_per_page=1000, budget=10**12)
    assert all(fits.values()) and pages == 128 * 512 + 1
    assert G.fit_cases(cases, 64, 1000, 0) == (2, dict.fromkeys(cases, False))


def test_table_reports_cases_that_do_not_fit(bench, capsys):
    _, G = bench
    out = {"device": "X", "copy_gbs": 1.0, "settings": {"kv_layout": "fp8_656", "page_size": 64},
           "model": {"layers": 4, "dense_layers": 1, "weight_bytes": 4e10}, "kernels": {}, "setups": [],
           "rows": [{"case": "b128 ctx32K", "fits": False, "kv_bytes": 2**34}]}
    G.print_table(out)
    assert capsys.readouterr().out.strip().splitlines()[-1] == "| b128 ctx32K | does not fit (16.0 GiB KV) | | | | | | | |"
