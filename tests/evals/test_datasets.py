"""``--data``: JSONL rows, bad files, the gsm8k download and cache, the shipped sets, few-shot prompts."""

from __future__ import annotations

import json
import random

import pytest

from dsa_runtime.errors import ConfigError
from dsa_runtime.evals import datasets
from dsa_runtime.evals.datasets import EvalSet, Question, load, read_jsonl
from dsa_runtime.evals.prompts import chat_messages, solution_text

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _gsm8k_rows(rng, n):
    rows = []
    for _ in range(n):
        a, b = rng.randint(2, 999), rng.randint(2, 999)
        rows.append({"question": f"Tom has {a} apples and buys {b}. How many?",
                     "answer": f"He has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b:,}"})
    return rows


def test_rows_of_every_answer_form(tmp_path):
    path = _write(tmp_path / "q.jsonl", [
        {"question": "2 + 2?", "answer": 4},
        {"question": "Half of 5?", "answer": 2.5},
        {"question": "Cost?", "answer": "$1,200"},
        {"question": "Work it out", "answer": "3 * 4 = 12.\n#### 12"},
        "",  # blank lines are skipped
        {"question": "Weather in Oslo?", "tools": [TOOL], "answer": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]},
    ])  # fmt: skip
    qs = read_jsonl(path)
    assert [q.answer for q in qs[:4]] == ["4", "2.5", "1200", "12"]
    assert qs[3].solution == "3 * 4 = 12.\n#### 12" and qs[0].tools is None
    assert qs[4].tools == [TOOL] and qs[4].answer == [{"name": "get_weather", "arguments": {"city": "Oslo"}}]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "q.jsonl:2: "),
        ('["a list"]', "q.jsonl:2: a row must be a JSON object"),
        ('{"answer": 3}', "q.jsonl:2: 'question'"),
        ('{"question": "", "answer": 3}', "'question' must be a non-empty string"),
        ('{"question": "q", "answer": "none at all"}', "holds no number"),
        ('{"question": "q", "answer": true}', "'answer' must be a number"),
        ('{"question": "q", "tools": {}, "answer": []}', "'tools' must be a list"),
        ('{"question": "q", "tools": [], "answer": [{"name": "f", "arguments": "{}"}]}', "'answer' must be a list of"),
    ],
)
def test_a_bad_row_names_its_file_and_line(tmp_path, line, message):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "ok", "answer": 1}\n' + line + "\n")
    with pytest.raises(ConfigError, match="q.jsonl:2: ") as err:
        read_jsonl(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_missing_empty_and_binary_files(tmp_path):
    with pytest.raises(ConfigError, match="neither a named set .*gsm8k.* nor a file"):
        load(str(tmp_path / "nope.jsonl"))
    with pytest.raises(ConfigError, match="no questions"):
        read_jsonl(_write(tmp_path / "empty.jsonl", ["", "  "]))
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="cannot read"):
        read_jsonl(tmp_path / "bin.jsonl")


def test_gsm8k_downloads_once_into_the_cache(tmp_path, monkeypatch):
    rng = random.Random(3)
    src = tmp_path / "src"
    src.mkdir()
    _write(src / "test.jsonl", _gsm8k_rows(rng, 7))
    _write(src / "train.jsonl", _gsm8k_rows(rng, 9))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(datasets, "GSM8K_URL", f"file://{src}/{{split}}.jsonl")
    data = load("gsm8k")
    cached = tmp_path / "cache" / "dsa-runtime" / "datasets" / "gsm8k"
    assert sorted(p.name for p in cached.iterdir()) == ["test.jsonl", "train.jsonl"]
    assert len(data.questions) == 7 and len(data.shots) == 9 and (data.num_shots, data.thinking) == (5, False)
    examples, questions = data.split(5)
    assert examples == data.shots[:5] and questions == data.questions  # examples from train, every test question
    (src / "test.jsonl").unlink()  # later runs read the cache, offline
    assert load("gsm8k").questions == data.questions


def test_gsm8k_offline_is_one_clear_error_and_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(datasets, "GSM8K_URL", f"file://{tmp_path}/absent-{{split}}.jsonl")
    with pytest.raises(ConfigError, match=r"cannot download gsm8k .*put the file at .*test\.jsonl or pass --data FILE"):
        load("gsm8k")
    assert not (tmp_path / "cache").exists()


def test_file_examples_come_from_its_head():
    qs = [Question(f"q{i}", str(i)) for i in range(6)]
    examples, questions = EvalSet("f", qs).split(2)
    assert examples == qs[:2] and questions == qs[2:]
    assert EvalSet("f", qs).split(0) == ([], qs)
    with pytest.raises(ConfigError, match="at least one must be left"):
        EvalSet("f", qs).split(6)
    with pytest.raises(ConfigError, match="has 3 examples"):
        EvalSet("f", qs, shots=qs[:3]).split(4)
    tools = [*qs, Question("w?", [{"name": "f", "arguments": {}}], tools=[TOOL])]
    with pytest.raises(ConfigError, match="--num-shots 0"):
        EvalSet("f", tools).split(1)


def test_shipped_sets():
    arith, tools = load("tinychat-arith"), load("tinychat-tools")
    assert (len(arith.questions), arith.num_shots, arith.thinking) == (200, 0, True)
    assert (len(tools.questions), tools.num_shots, tools.thinking) == (100, 0, False)
    assert all(q.tools is None and q.answer.lstrip("-").isdigit() for q in arith.questions)
    for q in tools.questions:
        offered = {t["function"]["name"] for t in q.tools}
        assert q.answer and {c["name"] for c in q.answer} <= offered


def test_few_shot_messages():
    ex = Question("Tom has 3 apples and buys 4?", "7", solution="He has 3 + 4 = <<3+4=7>>7 apples.\n#### 7")
    bare = Question("2 + 2?", "4", solution="4")
    assert solution_text(ex) == "He has 3 + 4 = 7 apples.\nThe answer is 7."
    assert solution_text(bare) == "The answer is 4."
    msgs = chat_messages(Question("5 + 5?", "10"), [ex, bare])
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant", "user"]
    assert msgs[0]["content"] == ex.question and msgs[-1] == {"role": "user", "content": "5 + 5?"}
    assert chat_messages(bare, []) == [{"role": "user", "content": "2 + 2?"}]
