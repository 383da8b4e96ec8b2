"""bench/common.write_json: the benchmarks' JSON is written whole or not at all."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def common(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import common as mod

    return mod


def test_write_json_replaces_the_file_atomically(common, tmp_path):
    target = tmp_path / "out" / "r.json"
    common.write_json(target, {"a": 1})
    common.write_json(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": 2}
    assert sorted(p.name for p in target.parent.iterdir()) == ["r.json"]


def test_write_json_leaves_no_partial_file_on_a_value_json_cannot_write(common, tmp_path):
    target = tmp_path / "r.json"
    common.write_json(target, {"a": 1})
    with pytest.raises(TypeError):
        common.write_json(target, {"config": object()})
    assert json.loads(target.read_text()) == {"a": 1}  # the previous file stands
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temp file left


def test_topk_bench_configs_are_json_writable(common, tmp_path):
    # the top-k bench writes its configs (TopKConfig holds a SamplePlan) into its JSON
    pytest.importorskip("triton")
    import topk_triton

    data = {n: dataclasses.asdict(c) for n, c in topk_triton.CONFIGS.items()}
    common.write_json(tmp_path / "t.json", {"configs": data})
    back = json.loads((tmp_path / "t.json").read_text())
    assert back["configs"]["no_sample"]["sample"] is None
    assert back["configs"]["sample_s16"]["sample"]["slices"] == 16


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graph_layers_ms_captures_every_call_once(common):
    x = torch.zeros(4, device="cuda")
    calls = [lambda i=i: x[i].add_(1.0) for i in range(4)]
    per_call = common.graph_layers_ms(calls)
    assert 0.0 < per_call < 1.0  # ms per call: four small kernels in one graph
    # two warm-up rounds outside the capture, then every replay of the timing: each call ran as often as the others
    counts = x.tolist()
    assert counts[0] >= 3 and counts == [counts[0]] * 4
