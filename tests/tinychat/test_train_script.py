"""train/train_tiny.py end to end on the CPU (a few steps): stages, loss log, resume state, loadable checkpoint."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "train" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_three_stages_write_a_log_a_resumable_state_and_an_fp8_checkpoint(tmp_path, capsys):
    train = _load("train_tiny")
    out = tmp_path / "run"
    assert train.main(["--out", str(out), "--device", "cpu", "--ctx", "128", "--batch", "2",
                       "--conversations", "60", "--steps", "6", "--workers", "1"]) == 0
    table = capsys.readouterr().out.strip().splitlines()[-4:]
    assert table[0].split() == ["stage", "steps", "ce", "kl", "acc", "sec"]
    assert [row.split()[0] for row in table[1:]] == ["dense", "warmup", "sparse"]
    log = [json.loads(line) for line in (out / "loss.jsonl").read_text().splitlines()]
    assert {r["stage"] for r in log} == {"dense", "warmup", "sparse"}
    assert all(r["kl"] == 0 for r in log if r["stage"] == "dense")
    assert all(r["kl"] > 0 for r in log if r["stage"] != "dense")
    assert len(list(out.glob("state-*.safetensors"))) == 4

    from dsa_runtime import LLM, SamplingParams

    llm = LLM(model=str(out / "checkpoint"))
    (res,) = llm.generate("Hello", SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert len(res.token_ids) == 3

    export = _load("export_tiny")
    assert export.main([str(out), str(tmp_path / "exported")]) == 0
    a = json.loads((tmp_path / "exported" / "model.safetensors.index.json").read_text())
    b = json.loads((out / "checkpoint" / "model.safetensors.index.json").read_text())
    assert a["weight_map"] == b["weight_map"]
