"""``dsa-runtime eval`` wiring: a JSONL file through a scripted client and through a live server (the OpenAI
client, tool calls and thinking over HTTP), the table, the JSON report, the gate's exit code, bad input."""

from __future__ import annotations

import json
import sys
import types

import pytest

from dsa_runtime.cli import eval_cmd
from dsa_runtime.cli.main import main
from dsa_runtime.evals.clients import Reply, RequestFailed

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "weather",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}  # fmt: skip
ROWS = [
    {"question": "Ann has 3 pens and gets 4 more. How many?", "answer": "3 + 4 = <<3+4=7>>7 pens.\n#### 7"},
    {"question": "What is 2 + 2?", "answer": 4},
    {"question": "What is 9 * 9?", "answer": "81"},
    {"question": "What is 1,000 + 234?", "answer": "#### 1,234"},
    {"question": "Name a colour and a number.", "answer": 5},
    {"question": "What is 6 - 8?", "answer": -2},
]
REPLIES = {  # question -> the scripted client's reply (content, tool calls)
    ROWS[0]["question"]: ("7 pens.", []),
    "What is 2 + 2?": ("2 + 2 = 4. The answer is 4.", []),
    "What is 9 * 9?": ("9 * 9 = 80.", []),  # wrong
    "What is 1,000 + 234?": ("It is $1,234.", []),
    "Name a colour and a number.": ("Blue.", []),  # invalid: no number
    "What is 6 - 8?": ("", "fail"),  # the endpoint refuses this one
}


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


class ScriptedClient:
    """The client interface of ``dsa_runtime.evals.clients`` answering from :data:`REPLIES`."""

    model = "scripted"

    def __init__(self):
        self.requests, self.started, self.closed = [], False, False

    async def start(self):
        self.started = True

    async def chat(self, messages, tools, sampling):
        self.requests.append((messages, tools, sampling))
        content, calls = REPLIES[messages[-1]["content"]]
        if calls == "fail":
            raise RequestFailed("400: prompt too long")
        return Reply(content, calls, 10 * len(messages), len(content), "stop")

    async def close(self):
        self.closed = True


@pytest.fixture
def scripted(monkeypatch):
    client = ScriptedClient()
    monkeypatch.setattr(eval_cmd, "_client", lambda args: client)
    return client


def test_file_run_prints_the_table_and_writes_the_report(tmp_path, scripted, capsys):
    out = tmp_path / "report.json"
    code = main(["eval", "--data", _jsonl(tmp_path / "q.jsonl", ROWS), "--num-shots", "1", "--parallel", "3",
                 "--max-tokens", "64", "--seed", "7", "--json", str(out)])  # fmt: skip
    stdout = capsys.readouterr().out
    assert code == 0 and scripted.started and scripted.closed
    assert stdout.splitlines()[0] == "q.jsonl: 5 questions, 1-shot, thinking off, scripted (http://127.0.0.1:30000/v1), parallel 3"
    table = dict(line.split("  ", 1) for line in stdout.splitlines()[1:])
    written = sum(len(REPLIES[r["question"]][0]) for r in ROWS[1:5])  # 56: the first row is the example
    assert {k.strip(): v.strip() for k, v in table.items()} == {
        "accuracy": "0.400 (2/5)",
        "invalid": "0.400 (2/5)",
        "errors": "1",
        "prompt tokens": "120 (24.0 per question)",
        "output tokens": f"{written} ({written / 5:.1f} per question)",
        "output tokens/s": table["output tokens/s"].strip(),
        "latency mean / p50 / p90 / max": table["latency mean / p50 / p90 / max"].strip(),
        "wall time": table["wall time"].strip(),
    }
    # one example (the file's first row, its calculator note dropped), then the question; settings passed on
    messages, tools, sampling = scripted.requests[0]
    assert messages[:2] == [{"role": "user", "content": ROWS[0]["question"]},
                            {"role": "assistant", "content": "3 + 4 = 7 pens.\nThe answer is 7."}]  # fmt: skip
    assert tools is None and (sampling.max_tokens, sampling.temperature, sampling.seed, sampling.thinking) == (64, 0.0, 7, False)
    assert sorted(r[0][-1]["content"] for r in scripted.requests) == sorted(r["question"] for r in ROWS[1:])

    report = json.loads(out.read_text())
    assert set(report) == {"settings", "results", "records"}
    assert report["settings"] == {"data": "q.jsonl", "model": "scripted", "endpoint": "http://127.0.0.1:30000/v1",
                                  "num_shots": 1, "num_questions": 5, "parallel": 3, "max_tokens": 64,
                                  "temperature": 0.0, "seed": 7, "thinking": False}  # fmt: skip
    res = report["results"]
    assert (res["questions"], res["correct"], res["accuracy"], res["invalid"], res["errors"]) == (5, 2, 0.4, 2, 1)
    assert set(res) == {"questions", "correct", "accuracy", "invalid", "invalid_rate", "errors", "prompt_tokens",
                        "completion_tokens", "wall_s", "output_tokens_per_s", "latency_s"}  # fmt: skip
    assert set(res["latency_s"]) == {"mean", "p50", "p90", "max"}
    assert res["latency_s"]["p50"] <= res["latency_s"]["p90"] <= res["latency_s"]["max"]
    records = report["records"]
    assert [r["index"] for r in records] == list(range(5))
    assert [(r["expected"], r["extracted"], r["correct"], r["invalid"]) for r in records] == [
        ("4", "4", True, False), ("81", "80", False, False), ("1234", "1234", True, False),
        ("5", None, False, True), ("-2", None, False, True)]  # fmt: skip
    assert records[4]["error"] == "400: prompt too long" and records[4]["finish_reason"] == "error"
    assert records[1]["reply"] == "9 * 9 = 80." and records[0]["prompt_tokens"] == 30


@pytest.mark.parametrize(("gate", "code"), [("0.4", 0), ("0.41", 1)])
def test_min_accuracy_is_the_exit_code(tmp_path, scripted, capsys, gate, code):
    assert main(["eval", "--data", _jsonl(tmp_path / "q.jsonl", ROWS), "--num-shots", "1",
                 "--min-accuracy", gate, "--disable-tqdm"]) == code  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert err == ("" if code == 0 else f"dsa-runtime: accuracy 0.400 is below --min-accuracy {gate}")


def test_num_questions_takes_the_first(tmp_path, scripted, capsys):
    assert main(["eval", "--data", _jsonl(tmp_path / "q.jsonl", ROWS), "--num-shots", "0", "--num-questions", "2",
                 "--thinking"]) == 0  # fmt: skip
    asked = [r[0] for r in scripted.requests]
    assert len(asked) == 2 and all(len(m) == 1 for m in asked)
    assert {m[0]["content"] for m in asked} == {ROWS[0]["question"], ROWS[1]["question"]}
    assert all(r[2].thinking for r in scripted.requests)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--data", "missing.jsonl"], "--data missing.jsonl: neither a named set"),
        (["--data", "BAD"], "bad.jsonl:2: "),
        (["--parallel", "0"], "--parallel must be >= 1, got 0"),
        (["--num-questions", "0"], "--num-questions must be >= 1"),
        (["--num-shots", "-1"], "--num-shots must be >= 0"),
        (["--max-tokens", "0"], "--max-tokens must be >= 1"),
        (["--temperature", "-1"], "--temperature must be >= 0"),
        (["--min-accuracy", "95"], "--min-accuracy is a share between 0 and 1, got 95.0"),
        (["--json", "no/such/dir/out.json"], "--json no/such/dir/out.json: no such directory"),
        (["--kv-cache-dtype", "bf16"], "--kv-cache-dtype: engine options apply only with --in-process"),
        (["--data", "tinychat-tools", "--num-shots", "2"], "tinychat-tools asks for tool calls; run it with --num-shots 0"),
        (["--data", "OK", "--num-shots", "9"], "has 6 rows"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, monkeypatch, scripted, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.jsonl").write_text('{"question": "a", "answer": 1}\n{"question": "b"}\n')
    _jsonl(tmp_path / "ok.jsonl", ROWS)
    argv = ["bad.jsonl" if a == "BAD" else "ok.jsonl" if a == "OK" else a for a in argv]
    assert main(["eval", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and not scripted.requests
    assert captured.err.count("\n") == 1 and captured.err.startswith("dsa-runtime: error: ") and message in captured.err
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--num-shots", "x"], "invalid int value: 'x'"), (["--shots", "5"], "unrecognized arguments: --shots"),
     (["--in-process", "--base-url", "http://x/v1"], "not allowed with argument")],
)
def test_bad_flags_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(["eval", *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err.strip().splitlines()[-1]


def test_without_the_openai_client_one_line_names_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "openai", None)  # import openai -> ImportError
    assert main(["eval", "--data", _jsonl(tmp_path / "q.jsonl", ROWS)]) == 2
    err = capsys.readouterr().err
    assert err == ("dsa-runtime: error: eval against a server needs the openai client: "
                   "pip install 'dsa-runtime[eval]' (or use --in-process)\n")  # fmt: skip


def test_an_unreachable_server_is_one_line(tmp_path, capsys):
    pytest.importorskip("openai")
    assert main(["eval", "--data", _jsonl(tmp_path / "q.jsonl", ROWS), "--base-url", "http://127.0.0.1:9/v1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dsa-runtime: error: cannot reach http://127.0.0.1:9/v1")


# ------------------------------------------------------------------------------------------- over HTTP
D = "｜DSML｜"
CALL = (f'\n\n<{D}function_calls>\n<{D}invoke name="get_weather">\n<{D}parameter name="city" string="true">'
        f"Oslo</{D}parameter>\n</{D}invoke>\n</{D}function_calls>")  # fmt: skip


def _script(prompt: str) -> str:
    """Thinking-mode replies: reasoning (with a distracting number), then the answer or a DSML call."""
    question = prompt.rsplit("<｜User｜>", 1)[1]
    if "weather in Oslo" in question:
        return "I call the tool 99 times.</think>" + CALL
    if "weather in Rome" in question:
        return "No tool.</think>It is sunny."
    reply = {"What is 2 + 2?": "The answer is 4.", "What is 9 * 9?": "It is 80."}
    return "Thinking about 12345.</think>" + next(v for k, v in reply.items() if k in question)


def test_over_http_with_tools_and_thinking(tmp_path, capsys):
    pytest.importorskip("openai")
    from tests.server.needs import server_extra

    server_extra()
    from tests.server.live import LiveServer
    from tests.server.scripted_engine import ScriptedEngine

    rows = [ROWS[1], ROWS[2],
            {"question": "What's the weather in Oslo?", "tools": [TOOL], "answer": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]},
            {"question": "What's the weather in Rome?", "tools": [TOOL], "answer": [{"name": "get_weather", "arguments": {"city": "Rome"}}]}]  # fmt: skip
    prompts = []
    engine = ScriptedEngine(lambda p: prompts.append(p) or _script(p))
    engine.model_config = types.SimpleNamespace(is_dsa=True)
    out = tmp_path / "r.json"
    with LiveServer(engine, served_model_name="scripted-v32", api_key="sekret") as srv:
        code = main(["eval", "--base-url", f"{srv.url}/v1", "--api-key", "sekret", "--data",
                     _jsonl(tmp_path / "q.jsonl", rows), "--num-shots", "0", "--thinking", "--json", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    report = json.loads(out.read_text())
    assert report["settings"]["model"] == "scripted-v32" and report["settings"]["thinking"] is True
    assert len(prompts) == 4 and all(p.endswith("<｜Assistant｜><think>") for p in prompts)
    got = [(r["extracted"], r["correct"], r["invalid"]) for r in report["records"]]
    assert got == [("4", True, False), ("80", False, False),
                   ([{"name": "get_weather", "arguments": {"city": "Oslo"}}], True, False), ([], False, True)]  # fmt: skip
    assert report["records"][2]["finish_reason"] == "tool_calls"
    assert report["results"]["completion_tokens"] == sum(len(_script(p)) for p in prompts)  # character tokens


def test_over_http_a_wrong_key_is_one_line(tmp_path, capsys):
    pytest.importorskip("openai")
    from tests.server.needs import server_extra

    server_extra()
    from tests.server.live import LiveServer
    from tests.server.scripted_engine import ScriptedEngine

    engine = ScriptedEngine(lambda p: "4")
    engine.model_config = types.SimpleNamespace(is_dsa=True)
    with LiveServer(engine, api_key="sekret") as srv:
        code = main(["eval", "--base-url", f"{srv.url}/v1", "--api-key", "wrong", "--data",
                     _jsonl(tmp_path / "q.jsonl", ROWS), "--num-shots", "1"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"dsa-runtime: error: {srv.url}/v1: 401: ")


def test_an_endpoint_lost_mid_run_stops_every_client(tmp_path, monkeypatch, capsys):
    import asyncio

    from dsa_runtime.errors import ConfigError

    class Dropping(ScriptedClient):
        async def chat(self, messages, tools, sampling):
            await asyncio.sleep(0.01 * len(self.requests))
            self.requests.append(messages)
            if len(self.requests) == 2:
                raise ConfigError("cannot reach http://x/v1 (connection reset)")
            await asyncio.sleep(10)  # still in flight when the other client fails
            raise AssertionError("not cancelled")

    client = Dropping()
    monkeypatch.setattr(eval_cmd, "_client", lambda args: client)
    out = tmp_path / "r.json"
    assert main(["eval", "--data", _jsonl(tmp_path / "q.jsonl", ROWS), "--parallel", "2", "--num-shots", "0",
                 "--json", str(out), "--disable-tqdm"]) == 2  # fmt: skip
    captured = capsys.readouterr()
    assert captured.err == "dsa-runtime: error: cannot reach http://x/v1 (connection reset)\n" and captured.out == ""
    assert len(client.requests) == 2 and client.closed and not out.exists()


def test_in_process_passes_engine_options_and_scores_a_refused_prompt_as_an_error(tmp_path, capsys):
    rows = [{"question": "What is 12 + 30?", "answer": 42}, {"question": "What is 2 + 2? " * 80, "answer": 4}]
    out = tmp_path / "r.json"
    code = main(["eval", "--in-process", "--data", _jsonl(tmp_path / "q.jsonl", rows), "--num-shots", "0",
                 "--max-model-len", "128", "--max-tokens", "32", "--thinking", "--json", str(out), "--disable-tqdm"])  # fmt: skip
    assert code == 0
    report = json.loads(out.read_text())
    assert report["settings"]["endpoint"] == "in-process" and report["settings"]["model"] == "tiny-chat"
    first, long = report["records"]
    assert first["error"] is None and first["prompt_tokens"] > 5 and 0 < first["completion_tokens"] <= 32
    assert long["invalid"] and long["error"] and "128" in long["error"] and long["finish_reason"] == "error"
