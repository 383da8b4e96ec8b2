"""The CI gate: the embedded model's accuracy on its held-out sets, in-process on the CPU.

Each gate is a few points below what the model scores on the first questions of the set (greedy, bf16, the
cpu platform; docs/eval.md has the measurements): a drop past it means a change broke the model's path
(kernels, cache, sampler, chat encoding, parsers), not noise.
"""

from __future__ import annotations

import json

import pytest

from dsa_runtime.cli.main import main

# set -> (questions, min accuracy). Measured: arith 26/30 = 0.867, tools 9/10 = 0.9 (full sets: 188/200 = 0.94, 90/100 = 0.90).
GATES = {"tinychat-arith": (30, 0.8), "tinychat-tools": (10, 0.8)}


@pytest.mark.parametrize("data", sorted(GATES))
def test_embedded_model_passes_its_gate(data, tmp_path, capsys):
    n, gate = GATES[data]
    out = tmp_path / "report.json"
    code = main(["eval", "--in-process", "--data", data, "--num-questions", str(n), "--min-accuracy", str(gate),
                 "--json", str(out), "--disable-tqdm"])  # fmt: skip
    report = json.loads(out.read_text())
    results = report["results"]
    misses = [(r["question"], r["expected"], r["extracted"]) for r in report["records"] if not r["correct"]]
    assert code == 0, (results["accuracy"], misses)
    assert results["questions"] == n and results["errors"] == 0
    assert results["invalid"] <= 1, misses  # the model answers in the expected form
    assert f"{results['accuracy']:.3f} ({results['correct']}/{n})" in capsys.readouterr().out
