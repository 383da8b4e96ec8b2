"""bench/full_size.py and full_size_plan.py without a GPU: the dry run (tiny preset, FP8 random weights, 2 gloo
ranks) serves both topologies through the engine and writes what the 8-GPU run will report; the per-rank memory
model matches what a rank actually loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_dry_run_serves_both_topologies(tmp_path):
    out = tmp_path / "full_size.json"
    cmd = [sys.executable, str(BENCH / "full_size.py"), "--device", "cpu", "--model", "tiny", "--gpus", "2",
           "--layers", "3", "--dense", "1", "--requests", "3", "--input-len", "24", "--output-len", "4",
           "--batch1-output", "3", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert [r["topology"] for r in data["runs"]] == ["tp2", "tp2-dp2"]
    for run in data["runs"]:
        load = run["load"]
        assert load["output_tokens"] == 3 * 4 and load["output_tok_s"] > 0
        assert 0 < load["ttft_ms_p50"] <= load["ttft_ms_p99"] and load["tpot_ms_p50"] > 0
        assert run["batch1"]["output_tokens"] == 3
        assert run["experts_touched_source"].startswith("measured")
        assert 0 < run["experts_touched_per_moe_layer"] <= 3 * 8  # 3 tokens pick at most 8 experts each
        assert run["roofline"]["weight_bytes"] > 0 and run["roofline"]["kv_bytes"] > 0
        assert [m["weights"] > 0 for m in run["memory_per_rank"]] == [True, True]
    assert "| tp2-dp2 |" in proc.stdout and "anchor: SGLang" in proc.stdout


def test_rank_weight_model_matches_the_loaded_slices(monkeypatch):
    """``rank_weight_bytes`` (shapes only) counts exactly the bytes ``rank_random_state`` draws for a rank, with
    non-expert FP8 linears counted at bf16 (they are dequantised at load) and their scales dropped. Five layers
    (one dense): the count is made from two shallow models and extended, which must still be exact."""
    import torch

    monkeypatch.syspath_prepend(str(BENCH))
    import full_size_plan as plan

    from dsa_runtime.distributed.random_weights import rank_random_state
    from dsa_runtime.distributed.sharding import SCALE_SUFFIX

    config = plan.model_config("tiny", 5, 1)
    for topo in plan.topologies(2, "tp,dp,ep,dpep"):
        info = topo.parallel(60.0).rank_info(1)
        model = plan.rank_weight_bytes(config, info)
        drawn = rank_random_state(config, info, "cpu", seed=0, fp8=True)
        expect = 0
        for name, t in drawn.items():
            expert = ".experts." in name or ".shared_experts." in name
            if name.endswith(SCALE_SUFFIX):
                expect += t.numel() * 4 if expert else 0
            elif t.dtype == torch.float8_e4m3fn and not expert:
                expect += t.numel() * 2
            else:
                expect += t.numel() * t.element_size()
        assert model["total"] == expect, topo.name
        assert 0 < model["routed_experts"] < model["total"]
