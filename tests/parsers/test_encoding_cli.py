"""``dsa-runtime encode``: golden prompt through the CLI (in-process and as a real subprocess), errors."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dsa_runtime.cli.main import main

B = "<｜begin▁of▁sentence｜>"


def _run(monkeypatch, capsys, argv: list[str], stdin: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    rc = main(["encode", *argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_cli_golden_in_process(monkeypatch, capsys, golden_files):
    src, expected = golden_files
    rc, out, err = _run(monkeypatch, capsys, ["--thinking-mode", "thinking"], src.read_text(encoding="utf-8"))
    assert (rc, err) == (0, "")
    assert out == expected  # nothing added, no trailing newline


def test_cli_golden_subprocess(golden_files):
    src, expected = golden_files
    exe = Path(sys.executable).with_name("dsa-runtime")
    if not exe.is_file():
        pytest.skip(f"{exe} not installed")
    with src.open("rb") as stdin:
        result = subprocess.run(
            [str(exe), "encode"], stdin=stdin, capture_output=True, timeout=60, check=False
        )
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout == expected.encode("utf-8")


E_INPUT = json.dumps(
    {
        "messages": [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "Hello! I am DeepSeek.", "reasoning_content": "thinking..."},
            {"role": "user", "content": "1+1=?"},
        ]
    }
)
E_BODY = "<｜User｜>hello<｜Assistant｜></think>Hello! I am DeepSeek.<｜end▁of▁sentence｜><｜User｜>1+1=?<｜Assistant｜>"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], B + E_BODY + "<think>"),
        (["--thinking-mode", "chat"], B + E_BODY + "</think>"),
        (["--no-bos"], E_BODY + "<think>"),
        (["--no-generation-prompt"], B + E_BODY.removesuffix("<｜Assistant｜>")),
    ],
)
def test_cli_options(monkeypatch, capsys, argv, expected):
    rc, out, _ = _run(monkeypatch, capsys, argv, E_INPUT)
    assert (rc, out) == (0, expected)


def test_cli_keep_thinking(monkeypatch, capsys):
    rc, out, _ = _run(monkeypatch, capsys, ["--keep-thinking"], E_INPUT)
    assert rc == 0
    assert (
        out
        == B
        + "<｜User｜>hello<｜Assistant｜><think>thinking...</think>Hello! I am DeepSeek.<｜end▁of▁sentence｜>"
        + ("<｜User｜>1+1=?<｜Assistant｜><think>")
    )


def test_cli_accepts_a_bare_message_list_and_response_format(monkeypatch, capsys):
    rc, out, _ = _run(
        monkeypatch, capsys, ["--thinking-mode", "chat"], json.dumps([{"role": "user", "content": "q"}])
    )
    assert (rc, out) == (0, B + "<｜User｜>q<｜Assistant｜></think>")
    payload = {"messages": [{"role": "user", "content": "q"}], "response_format": {"type": "object"}}
    rc, out, _ = _run(monkeypatch, capsys, [], json.dumps(payload))
    assert rc == 0
    assert out.startswith(B + "\n\n## Response Format:\n\n")


@pytest.mark.parametrize(
    ("stdin", "message"),
    [
        ("{bad json", "stdin is not valid JSON"),
        ("", "no input"),
        ('{"msgs": []}', "input must be"),
        ('{"messages": [{"role": "bot", "content": "x"}]}', "messages[0]: unknown role 'bot'"),
        (
            '{"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}]}',
            "message 1 (tool)",
        ),
        ('{"messages": [], "tools": {"a": 1}}', "'tools' must be a list"),
    ],
)
def test_cli_errors_are_one_line_exit_2_and_nothing_on_stdout(monkeypatch, capsys, stdin, message):
    rc, out, err = _run(monkeypatch, capsys, [], stdin)
    assert rc == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("dsa-runtime: error: ")
    assert message in err


def test_cli_template_builtin_and_checkpoint_dir(monkeypatch, capsys, tmp_path):
    rc, out, _ = _run(monkeypatch, capsys, ["--template", "deepseek_v31", "--thinking"], E_INPUT)
    assert rc == 0
    assert out == B + E_BODY + "<think>"
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {"chat_template": "{{ bos_token }}{% for m in messages %}[{{ m['content'] }}]{% endfor %}"}
        ),
        encoding="utf-8",
    )
    for spec in (str(tmp_path), str(tmp_path / "tokenizer_config.json")):
        rc, out, _ = _run(monkeypatch, capsys, ["--template", spec, "--no-bos"], E_INPUT)
        assert (rc, out) == (0, "[hello][Hello! I am DeepSeek.][1+1=?]")


def test_cli_template_errors(monkeypatch, capsys, tmp_path):
    rc, out, err = _run(monkeypatch, capsys, ["--template", str(tmp_path)], E_INPUT)
    assert (rc, out) == (2, "")
    assert "no chat template" in err
    rc, out, err = _run(monkeypatch, capsys, ["--template", str(tmp_path / "missing.jinja")], E_INPUT)
    assert (rc, out) == (2, "")
    assert "no such template" in err
    bad = tmp_path / "evil.jinja"
    bad.write_text("{{ ''.__class__.__mro__ }}", encoding="utf-8")
    rc, out, err = _run(monkeypatch, capsys, ["--template", str(bad)], E_INPUT)
    assert (rc, out) == (2, "")
    assert "sandbox" in err
