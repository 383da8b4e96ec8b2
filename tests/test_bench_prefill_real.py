"""bench/prefill_real_gpu.py without a GPU: the FLOP model against a hand count on the tiny V3.2 preset, the
kernel-family classifier and its profiler scopes, the backend sets from backend availability, and the
``--dry-run`` (tiny preset on the CPU) writing one row per case."""

from __future__ import annotations

import inspect
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPT = BENCH / "prefill_real_gpu.py"


@pytest.fixture
def bench(monkeypatch):
    """The bench modules: ``prefill_flops`` as F, ``kernel_families`` as K, ``prefill_real_gpu`` as G."""
    monkeypatch.syspath_prepend(str(BENCH))
    import decode_real_setup as S
    import kernel_families as K
    import prefill_flops as F
    import prefill_real_gpu as G

    return F, K, G, S


def test_visible_keys_matches_the_sum(bench):
    F, *_ = bench
    for start in (0, 1, 5, 31, 32, 40):
        for n in (1, 2, 7, 33):
            for cap in (None, 1, 32, 36):
                want = sum(p + 1 if cap is None else min(p + 1, cap) for p in range(start, start + n))
                assert F.visible_keys(start, n, cap) == want, (start, n, cap)
    assert F.visible_keys(3, 0, 8) == 0


def test_chunk_flops_by_hand_on_the_tiny_preset(bench):
    """Tiny V3.2: hidden 256, 4 heads (nope 64, rope 64, v 64), q_lora 128, kv_lora 512, 3 layers (layer 0
    dense FFN 512, layers 1-2 MoE: 8 experts of 128, top 2, 1 shared), indexer 4 x 128 top-32, vocab 1024.
    A chunk of 10 rows at positions 30..39, the prompt's last."""
    F, _, _, S = bench
    config = S.dry_config()
    # MACs per token and layer: q_a 256*128, q_b 128*4*128, kv_a 256*576, W_UK 4*64*512, W_UV 4*512*64,
    # o_proj 4*64*256; indexer wq_b 128*4*128, wk 256*128, weights_proj 256*4.
    attn = 32768 + 65536 + 147456 + 131072 + 131072 + 65536
    index = 65536 + 32768 + 1024
    ffn = {0: 3 * 256 * 512, 1: 256 * 8, 2: 256 * 8}  # dense SwiGLU, then the MoE routers
    dense = sum(2 * 10 * (attn + index + ffn[layer]) for layer in range(3)) + 2 * 256 * 1024  # + lm_head, 1 row
    attention = 3 * 2 * 4 * (512 + 64 + 512) * (31 + 9 * 32)  # keys: min(p + 1, 32) for p = 30..39
    indexer = 3 * 2 * 4 * 128 * sum(range(31, 41))  # keys: p + 1
    moe = 2 * 2 * 10 * 3 * 256 * 128 * (2 + 1)  # two MoE layers, 2 routed + 1 shared expert per token
    assert F.chunk_flops(config, 30, 10, last=True) == {
        "dense": dense, "attention": attention, "indexer": indexer, "moe": moe}
    assert dense == 48_836_608 and attention == 8_329_728 and indexer == 1_090_560 and moe == 11_796_480
    assert F.chunk_flops(config, 30, 10, last=False)["dense"] == dense - 2 * 256 * 1024


def test_prompt_flops_sums_the_chunks_and_counts_lm_head_once(bench):
    F, _, _, S = bench
    config = S.dry_config()
    whole = F.prompt_flops(config, 100, 40)  # chunks 0..39, 40..79, 80..99
    parts = [F.chunk_flops(config, 0, 40, last=False), F.chunk_flops(config, 40, 40, last=False),
             F.chunk_flops(config, 80, 20, last=True)]
    assert whole == {f: sum(p[f] for p in parts) for f in whole}
    # The indexer and MoE work does not depend on the chunking; the attention's neither (same keys per row).
    one = F.prompt_flops(config, 100, 100)
    assert {f: one[f] for f in ("attention", "indexer", "moe", "dense")} == whole
    assert F.roofline_s({"dense": 2e12, "attention": 1e12, "indexer": 4e12, "moe": 2e12}, 300.0, 600.0) == (
        pytest.approx(3 / 300 + 6 / 600))
    with pytest.raises(ValueError, match="sparse attention"):
        from dsa_runtime.loader.presets import preset_config
        from dsa_runtime.model.config import ModelConfig

        F.chunk_flops(ModelConfig.from_hf(preset_config("tiny-v3")), 0, 4, last=True)


def test_classifier_table(bench):
    _, K, _, _ = bench
    items = [
        ("_ragged_kernel", "indexer.logits_ragged", 10.0),
        ("_scan_kernel", "topk.topk", 4.0),
        ("void at::native::vectorized_elementwise_kernel<4>", "moe.experts", 2.0),  # glue inside a method
        ("sm90_xmma_gemm_bf16bf16_bf16f32", None, 7.0),
        ("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTN", None, 3.0),
        ("void at::native::reduce_kernel<512, 1>", None, 1.5),
        ("Memcpy DtoD (Device -> Device)", None, 0.5),
        ("mystery_fused_rope", None, 0.25),
        ("mystery_fused_rope", None, 0.25),
        ("_unpack_fp8_kernel", "kv_quant.dequantize_mla", 1.0),
        ("sparse_attn_fwd_kernel", "sparse_attn.prefill", 6.0),
    ]
    totals, unknown = K.classify(items)
    assert totals == {"indexer": 10.0, "top-k": 4.0, "sparse attention": 6.0, "MoE": 2.0, "dense GEMMs": 10.0,
                      "KV cache": 1.0, "other": 2.5}
    assert unknown == {"mystery_fused_rope": 0.5}
    assert K.column_of("aten::addmm", None) == ("dense GEMMs", True)  # the CPU dry run's op names
    assert K.column_of("aten::add", None) == ("other", True)


def test_kernels_tied_to_no_op_are_found_and_classified_by_name(bench):
    """Device events the profiler tied to no CPU op are the ones left after taking out the tied kernels one for
    one (a kernel launched twice with the same duration is tied twice, not once); they land in their family's
    column by name."""
    _, K, _, _ = bench
    device = [("_sparse_mla_kernel", 50.0), ("_ragged_kernel", 8.0), ("_ragged_kernel", 8.0),
              ("sm90_m_grouped_fp8_gemm_contiguous", 20.0), ("sm90_xmma_gemm_bf16", 7.0), ("odd_kernel", 1.0)]
    tied = [("_ragged_kernel", 8.0), ("sm90_xmma_gemm_bf16", 7.0)]
    left = K.untied(device, tied)
    assert left == [("_sparse_mla_kernel", 50.0), ("_ragged_kernel", 8.0), ("sm90_m_grouped_fp8_gemm_contiguous", 20.0),
                    ("odd_kernel", 1.0)]
    totals, unknown = K.classify([(name, None, us) for name, us in left])
    assert (totals["sparse attention"], totals["indexer"], totals["MoE"], totals["dense GEMMs"]) == (50.0, 8.0, 20.0, 0.0)
    assert unknown == {"odd_kernel": 1.0} and totals["other"] == 1.0
    for name, column in (("_topk_rows_kernel", "top-k"), ("gemm_up", "MoE"), ("_pack_fp8_kernel", "KV cache"),
                         ("_rotate_quant_kernel", "indexer"), ("_fewhead_cols_kernel", "sparse attention")):
        assert K.column_of(name, None) == (column, True), name


def test_scoped_kernels_keep_signatures_and_name_their_profiler_ranges(bench):
    """Each method of the scoped copy calls the same backend method inside a ``dsa:`` range, keeps its
    signature (the model inspects ``store_mla`` for ``scale_fmt``), and a CPU profile attributes its ops."""
    _, K, _, S = bench
    from torch.profiler import ProfilerActivity, profile

    from dsa_runtime.model.runner import kernel_needs
    from dsa_runtime.resolve import KernelConfig, resolve_kernels

    config = S.dry_config()
    kernels = resolve_kernels(KernelConfig(platform="cpu", kv_layout="fp8_656"), needs=kernel_needs(config, 64))
    wrapped = K.scoped(kernels)
    assert wrapped.choices == kernels.choices and wrapped.kv_layout == "fp8_656"
    assert (inspect.signature(wrapped.kv_quant.store_mla).parameters.keys()
            == inspect.signature(kernels.kv_quant.store_mla).parameters.keys())
    k = torch.randn(24, 128, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    want = kernels.indexer.quantize_k(k, scale_fmt="ue8m0")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        got = wrapped.indexer.quantize_k(k, scale_fmt="ue8m0")
        torch.mm(k.float(), k.float().T)
    assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(got[1], want[1])
    items, unlinked = K.profiled_items(prof, cuda=False)
    scopes = {scope for _, scope, _ in items}
    assert "indexer.quantize_k" in scopes
    assert any(name == "aten::mm" and scope is None for name, scope, _ in items)
    assert unlinked == 0 and sum(us for _, _, us in items) > 0  # a CPU op is always its own
    totals, _ = K.classify(items)
    assert totals["indexer"] > 0 and totals["dense GEMMs"] > 0


def _availability(ok: set[str]):
    return lambda name: (True, "installed") if name in ok else (False, f"{name} is not installed")


def test_backend_sets_follow_availability(bench):
    _, _, G, _ = bench
    ours, peer = G.backend_sets(_availability({"tilelang", "triton", "flashmla_sparse", "deepgemm"}), peer=True)
    assert ours.settings == ["sparse_attn_prefill=tilelang", "indexer=triton", "moe=triton"]
    assert peer.settings == ["sparse_attn_prefill=flashmla_sparse", "indexer=deepgemm", "moe=deepgemm"]
    assert peer.status == "ready" and peer.missing == []
    ours, peer = G.backend_sets(_availability({"triton", "flashmla_sparse"}), peer=True)
    assert ours.settings == ["sparse_attn_prefill=triton", "indexer=triton", "moe=triton"]
    assert peer.settings == ["sparse_attn_prefill=flashmla_sparse"] and peer.status == "ready"
    assert peer.missing == ["indexer=deepgemm: deepgemm is not installed", "moe=deepgemm: deepgemm is not installed"]
    ours, peer = G.backend_sets(_availability(set()), peer=True)
    assert ours.settings == [] and peer.settings == [] and peer.status == "not installed" and len(peer.missing) == 3
    assert [s.name for s in G.backend_sets(_availability({"triton"}), peer=False)] == ["ours"]


def test_budget_estimates_from_the_largest_measured_ratio(bench):
    _, _, G, _ = bench
    budget = G.Budget(100.0)
    assert budget.estimate("ours", 2.0) == 2.0 * G.FIRST_WALL_OVER_ROOFLINE
    budget.measured("ours", 3.0, 1.0)
    budget.measured("ours", 2.0, 1.0)
    assert budget.estimate("ours", 2.0) == 6.0 and budget.estimate("peer", 1.0) == G.FIRST_WALL_OVER_ROOFLINE
    assert 99.0 < budget.left() <= 100.0


def test_chunk_steps_cover_the_prompt_once(bench):
    _, _, G, _ = bench
    ids = list(range(10, 110))
    steps = G.chunk_steps(3, ids, 40)
    assert [s.num_rows for s in steps] == [40, 40, 20]
    rows = torch.cat([s.rows for s in steps], dim=1)
    assert rows[0].eq(3).all() and rows[1].tolist() == ids and rows[2].tolist() == list(range(100))
    assert [s.pick.tolist() for s in steps] == [[], [], [19]]


def test_dry_run_writes_a_row_per_case(tmp_path):
    out = tmp_path / "prefill.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--prompts", "100,48", "--chunk-sizes", "40,64",
                          "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["device"] == "cpu (dry run)" and data["rates"]["bf16_tflops"] > 0
    assert data["model"]["layers"] == 3 and data["model"]["index_topk"] == 32
    assert [s["name"] for s in data["sets"]] == ["ours", "peer"]
    assert data["sets"][1]["status"] == "not installed" and len(data["sets"][1]["missing"]) == 3
    assert data["sets"][0]["kernels"]["sparse_attn.prefill"] == "torch"
    assert [(w["set"], w["chunk"]) for w in data["warmups"]] == [("ours", 40), ("ours", 64)]
    rows = data["rows"]
    assert [(r["set"], r["prompt"], r["chunk"]) for r in rows] == [
        ("ours", 48, 40), ("ours", 100, 40), ("ours", 48, 64), ("ours", 100, 64)]
    columns = ["indexer", "top-k", "sparse attention", "MoE", "dense GEMMs", "KV cache", "other"]
    for r in rows:
        assert r["finite"] and r["memory"] is None
        assert r["chunks"] == math.ceil(r["prompt"] / r["chunk"]) == len(r["chunk_ms"])
        assert r["wall_s"] == pytest.approx(sum(r["chunk_ms"]) / 1e3)
        assert r["tokens_per_s"] == pytest.approx(r["prompt"] / r["wall_s"])
        assert r["roofline_fraction"] == pytest.approx(r["roofline_s"] / r["wall_s"])
        assert set(r["flops"]) == {"dense", "attention", "indexer", "moe"} and r["flops"]["indexer"] > 0
        p = r["profile"]
        assert list(p["ms_per_layer"]) == columns and p["device"] == "cpu" and p["unlinked_ms"] == 0
        assert sum(p["ms_per_layer"].values()) * 3 == pytest.approx(p["total_ms"])
        assert p["ms_per_layer"]["indexer"] > 0 and p["ms_per_layer"]["MoE"] > 0
        assert p["calls_per_layer"]["indexer.logits_ragged"] >= 1 and p["calls_per_layer"]["moe.experts"] == 2 / 3
        assert r["kv_bytes"] == math.ceil(r["prompt"] / 64) * 64 * (656 + 132) * 3
    lines = run.stdout.strip().splitlines()
    assert lines[-1] == f"wrote {out}"
    assert any(line.startswith("| prompt | chunk | set | tok/s |") for line in lines)
    assert sum(line.startswith("| 100 | 64 | ours |") for line in lines) == 2  # throughput and family tables


def test_dry_run_skips_what_the_budget_cannot_hold(tmp_path):
    out = tmp_path / "prefill.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--prompts", "48", "--chunk-sizes", "40",
                          "--budget-s", "0", "--no-peer", "--json", str(out)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    data = json.loads(out.read_text())
    assert [s["name"] for s in data["sets"]] == ["ours"]
    assert len(data["rows"]) == 1 and "of --budget-s left" in data["rows"][0]["skipped"]
    assert "| 48 | 40 | ours | skipped: estimated" in run.stdout


@pytest.mark.parametrize("argv, message", [
    (["--dry-run", "--prompts", "1"], "at least 2 tokens"),
    (["--dry-run", "--chunk-sizes", "8k"], "comma-separated integers"),
    (["--dry-run", "--layers", "2", "--dense-layers", "3"], "dense layers"),
])
def test_bad_arguments_exit_2_with_one_line(argv, message):
    run = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and message in run.stderr.strip().splitlines()[-1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA refusal")
def test_refuses_without_cuda(tmp_path):
    out = tmp_path / "prefill.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--json", str(out)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip() == "prefill_real_gpu: needs a CUDA device (or --dry-run)"
    assert not out.exists()


def test_a_failing_set_stops_with_its_reason_and_the_run_goes_on(bench, tmp_path, monkeypatch, capsys):
    """A backend error (here: the first case of ``ours`` raising, as an out-of-memory would) is recorded for
    that case, the set stops, and the script still writes its JSON and table."""
    _, _, G, _ = bench
    calls = []

    def failing(runner, bset, *args):
        calls.append(bset.name)
        raise RuntimeError("CUDA out of memory. Tried to allocate 4.00 GiB\nmore detail")

    monkeypatch.setattr(G, "run_case", failing)
    out = tmp_path / "prefill.json"
    assert G.main(["--dry-run", "--prompts", "48,100", "--chunk-sizes", "40", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert calls == ["ours"]
    assert data["rows"] == [{"set": "ours", "prompt": 48, "chunk": 40,
                             "skipped": "RuntimeError: CUDA out of memory. Tried to allocate 4.00 GiB"}]
    assert data["sets"][0]["status"].startswith("failed at 48 / 40: RuntimeError")
    assert "| 48 | 40 | ours | skipped: RuntimeError" in capsys.readouterr().out
