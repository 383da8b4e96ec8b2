"""``dsa-runtime parse``: every example vector in-process (whole and streamed), errors, and real subprocess runs."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dsa_runtime.cli.main import main
from dsa_runtime.parsers.types import Delta, ToolCallDelta
from tests.parsers.parser_kit import EOS, FC, FCE, IE, PE, I, P, check_deltas
from tests.parsers.test_parser_vectors import VECTORS

ROOT = Path(__file__).resolve().parents[2]
# The console script installed next to the interpreter running the tests (any venv, any machine).
EXE = Path(sys.executable).with_name("dsa-runtime")
KEYS = {"content", "reasoning_content", "tool_calls", "finish_reason"}


def _flags(kwargs: dict) -> list[str]:
    flags = ["--tool-parser", kwargs.get("tool_parser") or "none"]
    if kwargs.get("reasoning_parser"):
        flags += ["--reasoning-parser", kwargs["reasoning_parser"]]
    if kwargs.get("thinking"):
        flags.append("--thinking")
    return flags


def run_cli(monkeypatch, capsys, argv: list[str], stdin: str | bytes) -> tuple[int, dict | None, str]:
    data = stdin.encode("utf-8") if isinstance(stdin, str) else stdin
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    rc = main(["parse", *argv])
    captured = capsys.readouterr()
    return rc, (json.loads(captured.out) if captured.out.strip() else None), captured.err


def _expect(obj: dict, content, reasoning, calls, finish_reason) -> None:
    assert obj["content"] == content
    assert obj["reasoning_content"] == reasoning
    assert obj["finish_reason"] == finish_reason
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in obj["tool_calls"]]
    assert got == calls
    for call in obj["tool_calls"]:
        assert set(call) == {"id", "type", "function"} and call["type"] == "function"


@pytest.mark.parametrize("vid", sorted(VECTORS))
@pytest.mark.parametrize("mode", [[], ["--chunk-size", "1"], ["--chunk-size", "4"], ["--chunks-json"]])
def test_cli_vectors(monkeypatch, capsys, vid, mode):
    kwargs, text, *expected = VECTORS[vid]
    stdin = json.dumps([text[:3], text[3:10], text[10:]]) if mode == ["--chunks-json"] else text
    rc, obj, err = run_cli(monkeypatch, capsys, [*_flags(kwargs), *mode], stdin)
    assert rc == 0, err
    assert set(obj) == (KEYS | {"deltas"} if mode else KEYS)
    _expect(obj, *expected)
    if mode:
        deltas = [
            Delta(
                content=d.get("content"),
                reasoning_content=d.get("reasoning_content"),
                tool_calls=[
                    ToolCallDelta(
                        index=tc["index"],
                        id=tc.get("id"),
                        type=tc.get("type"),
                        name=tc.get("function", {}).get("name"),
                        arguments=tc.get("function", {}).get("arguments"),
                    )
                    for tc in d.get("tool_calls", [])
                ],
            )
            for d in obj["deltas"]
        ]
        check_deltas(deltas)
        assert all(d.to_dict() == raw for d, raw in zip(deltas, obj["deltas"], strict=True))


def test_cli_s1_chunks_json(monkeypatch, capsys):
    chunks = [
        "Hi",
        "!\n\n<\uff5cDS",
        "ML\uff5cfunction_calls>\n<\uff5cDSML\uff5cinv",
        'oke name="get_time">\n\n</\uff5cDSML\uff5cinvoke>\n</\uff5cDSML\uff5cfunction_calls>',
    ]
    rc, obj, _ = run_cli(
        monkeypatch, capsys, ["--tool-parser", "deepseek_v32", "--chunks-json"], json.dumps(chunks)
    )
    assert rc == 0
    _expect(obj, "Hi!", None, [("get_time", {})], "tool_calls")
    assert obj["deltas"][:2] == [{"content": "Hi"}, {"content": "!"}]
    head = obj["deltas"][2]["tool_calls"][0]
    assert head["function"] == {"name": "get_time", "arguments": ""} and head["index"] == 0


def test_cli_truncated_unterminated_block(monkeypatch, capsys):
    text = f"Let me check.\n\n{FC}\n{I('get_weather')}\n{P('location', 'true')}Hang"
    for mode in ([], ["--chunk-size", "3"]):
        rc, obj, _ = run_cli(monkeypatch, capsys, ["--truncated", *mode], text)
        assert rc == 0
        _expect(obj, "Let me check.", None, [], "length")


def test_cli_tool_parser_none_keeps_text(monkeypatch, capsys):
    text = f"{FC}\n{I('x')}\n{IE}\n{FCE}"
    rc, obj, _ = run_cli(monkeypatch, capsys, ["--tool-parser", "none"], text)
    assert rc == 0
    _expect(obj, text, None, [], "stop")


def test_cli_keeps_carriage_returns(monkeypatch, capsys):
    rc, obj, _ = run_cli(monkeypatch, capsys, [], "a\r\nb")
    assert rc == 0 and obj["content"] == "a\r\nb"


def test_cli_text_stdin_without_buffer(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("plain"))
    assert main(["parse"]) == 0
    assert json.loads(capsys.readouterr().out)["content"] == "plain"


@pytest.mark.parametrize(
    ("argv", "stdin", "needle"),
    [
        (["--chunks-json"], '["a",', "not valid JSON"),
        (["--chunks-json"], '{"a": 1}', "list of strings"),
        (["--chunks-json"], '["a", 1]', "list of strings"),
        (["--tool-parser", "nope"], "x", "deepseekv32"),
        (["--reasoning-parser", "nope"], "x", "deepseek-r1"),
        ([], b"\xff\xfe", "UTF-8"),
    ],
)
def test_cli_bad_input_is_one_line_error(monkeypatch, capsys, argv, stdin, needle):
    rc, obj, err = run_cli(monkeypatch, capsys, argv, stdin)
    assert rc == 2 and obj is None
    assert err.count("\n") == 1 and err.startswith("dsa-runtime: error:") and needle in err


@pytest.mark.parametrize(
    "argv", [["--chunk-size", "0"], ["--chunk-size", "x"], ["--chunk-size", "2", "--chunks-json"]]
)
def test_cli_bad_flags_exit_2(monkeypatch, capsys, argv):
    with pytest.raises(SystemExit) as exc:
        run_cli(monkeypatch, capsys, argv, "x")
    assert exc.value.code == 2


def test_cli_lone_surrogate_from_chunks_json_is_escaped(monkeypatch, capsys):
    rc, obj, _ = run_cli(monkeypatch, capsys, ["--chunks-json"], '["a\\ud800b"]')
    assert rc == 0 and obj["content"] == "a\ud800b"


def test_cli_real_subprocess():
    text = f"需要日期📅</think>\n\n{FC}\n{I('get_datetime')}\n{P('timezone', 'true')}Asia/Shanghai{PE}\n{IE}\n{FCE}{EOS}"
    for extra in ([], ["--chunk-size", "2"]):
        proc = subprocess.run(
            [
                str(EXE),
                "parse",
                "--tool-parser",
                "deepseekv32",
                "--reasoning-parser",
                "deepseek-v3",
                "--thinking",
                *extra,
            ],
            input=text.encode("utf-8"),
            capture_output=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        obj = json.loads(proc.stdout.decode("utf-8"))
        _expect(obj, None, "需要日期📅", [("get_datetime", {"timezone": "Asia/Shanghai"})], "tool_calls")
        assert proc.stdout.decode("utf-8").count("\n") == 1  # one JSON object, one line


def test_cli_real_subprocess_error_exit_code():
    proc = subprocess.run(
        [str(EXE), "parse", "--chunks-json"], input=b"not json", capture_output=True, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stdout == b"" and proc.stderr.decode().startswith("dsa-runtime: error:")
