"""The held-out sets shipped for ``dsa-runtime eval`` are what ``train/tinychat/eval_sets.py`` writes."""

from __future__ import annotations

import json
import re

from dsa_runtime.evals.datasets import DATA_DIR
from train.tinychat.dialogs import heldout_pair
from train.tinychat.eval_sets import FILES, SIZES, jsonl, main
from train.tinychat.tools import TOOLS


def test_shipped_files_are_the_generators_output():
    for kind, name in FILES.items():
        assert (DATA_DIR / name).read_text() == jsonl(kind), f"regenerate: python -m train.tinychat.eval_sets {DATA_DIR}"


def test_main_writes_both_files(tmp_path):
    assert main([str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FILES.values())


def test_rows_are_held_out_and_answerable():
    arith = [json.loads(line) for line in jsonl("arith").splitlines()]
    assert len(arith) == SIZES["arith"]
    for row in arith:
        a, op, b = re.search(r"(\d+) (\+|-|\*|plus|minus|times) (\d+)", row["question"]).groups()
        assert heldout_pair(int(a), int(b)), row  # operand pairs never seen in training
        value = {"+": int(a) + int(b), "plus": int(a) + int(b), "-": int(a) - int(b), "minus": int(a) - int(b)}.get(
            op, int(a) * int(b))
        assert row["answer"] == str(value)
    schemas = {t.name: t.schema() for t in TOOLS}
    for row in (json.loads(line) for line in jsonl("tools").splitlines()):
        offered = {t["function"]["name"]: t for t in row["tools"]}
        assert all(offered[name] == schemas[name] for name in offered)
        for call in row["answer"]:
            props = offered[call["name"]]["function"]["parameters"]["properties"]
            assert set(call["arguments"]) <= set(props) and str(next(iter(call["arguments"].values()))) != ""
