"""Every command and snippet in README.md and docs/*.md runs as written: the docs cannot drift from the code.

What is extracted: fenced code blocks (any indentation, so those inside list items too) and indented code
blocks (4 spaces past the enclosing list item, after a blank line), plus inline `dsa-runtime ...` spans.

* Shell blocks (no language, ``sh``, ``bash``, ``shell``, ``console``; indented blocks): each command -- a line
  with its backslash continuations; comment lines are not commands -- is one test, run with ``bash -c`` and
  required to exit 0. A block whose first line holds ``[--`` / ``[-x`` is a usage synopsis instead: each usage
  line is one test, which checks that the command exists and that every flag it names is in its ``--help``.
* ``python`` blocks: one test per block, run with this interpreter; must exit 0.
* ``json`` / ``toml`` blocks must parse; ``text`` blocks (diagrams) are not run, and must not hold a command.
* Inline spans ``dsa-runtime CMD ARGS`` are parsed by the real CLI parser (not run): a wrong flag, choice or a
  missing argument fails. Spans with placeholders (``[--full]``, ``...``) get the synopsis check.

Where they run: in a scratch copy of the checkout made of symlinks (so a file a command writes lands in the
scratch folder, never in the checkout), with this interpreter's ``bin`` first on ``PATH`` and ``.venv`` in the
scratch folder pointing at this environment, ``DSA_*`` variables removed.

The server: a snippet that names ``127.0.0.1:30000`` (the documented default address) runs against one
``dsa-runtime serve`` on the embedded model, started by the ``doc_server`` fixture on a free loopback port
(``--port 0``; no ``--served-model-name``, so the default served name is what the docs must use). The only
change made to any snippet is that substitution: ``127.0.0.1:30000`` -> ``127.0.0.1:<that port>``. A shell
command's reply must not be an OpenAI error object (``curl -s`` exits 0 on a 404).

What does not run in CI is listed in ``ALLOWED`` with a reason per snippet (keyed by file and command text, so
a new snippet runs by default); ``NEEDS`` lists commands that run only when an optional module is installed
(skipped with that reason otherwise); ``SLOW`` marks the longer ones ``slow`` (CI runs them too). An entry of any
of the three that no longer matches a snippet in the docs fails ``test_every_listed_snippet_is_in_the_docs``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import urllib.request
from functools import cache
from pathlib import Path

import pytest

from tests.docs.markdown_snippets import (
    DOC_FILES,
    DOC_PORT,
    REPO,
    Snippet,
    code_blocks,
    doc_snippets,
    strip_comment,
)
from tests.docs.snippet_lists import ALLOWED, NEEDS, SLOW

TIMEOUT_S = 300

SNIPPETS = doc_snippets()


def _params(kind: str) -> list:
    params = []
    for s in SNIPPETS:
        if s.kind != kind:
            continue
        marks = [pytest.mark.slow] if s.key in SLOW else []
        params.append(pytest.param(s, id=s.id, marks=marks))
    return params


# ---------------------------------------------------------------------------------------------- environment

def _ignore(folder: str, names: list[str]) -> set[str]:
    return {n for n in names if n in ("__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis", ".gpu-deps",
                                      "build", "dist") or n.endswith(".egg-info")}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """The checkout as a tree of symlinks (writes stay here), with ``.venv`` pointing at this environment."""
    root = tmp_path_factory.mktemp("checkout")
    for entry in REPO.iterdir():
        if entry.name in (".git", ".venv") or _ignore("", [entry.name]):
            continue
        if entry.is_dir():
            shutil.copytree(entry, root / entry.name, copy_function=os.symlink, ignore=_ignore)
        else:
            os.symlink(entry, root / entry.name)
    os.symlink(Path(sys.executable).parent.parent, root / ".venv")
    return root


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    bindir = str(Path(sys.executable).parent)
    out = {k: v for k, v in os.environ.items() if not k.startswith("DSA_")}
    out.update(PATH=bindir + os.pathsep + out.get("PATH", ""), PYTHONUNBUFFERED="1", COLUMNS="200")
    return out


@pytest.fixture(scope="module")
def doc_server(scratch, env):
    """``dsa-runtime serve`` (embedded model, defaults but ``--port 0``) from the scratch checkout: its address."""
    from tests.server.needs import server_extra

    server_extra()
    program = shutil.which("dsa-runtime", path=env["PATH"])  # the console script the docs run, if installed
    argv = [program] if program else [sys.executable, "-m", "dsa_runtime.cli.main"]
    proc = subprocess.Popen([*argv, "serve", "--port", "0"], cwd=scratch, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    log: list[str] = []
    found = threading.Event()
    address: list[str] = []

    def drain() -> None:  # keep reading: a full pipe would block the server
        for line in proc.stdout:
            log.append(line)
            m = re.search(r"serving '[^']*' at http://(127\.0\.0\.1:\d+)/v1", line)
            if m and not address:
                address.append(m.group(1))
                found.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        if not found.wait(120):
            raise RuntimeError(f"dsa-runtime serve did not start in 120 s:\n{''.join(log)[-3000:]}")
        with urllib.request.urlopen(f"http://{address[0]}/health", timeout=30) as r:
            assert r.status == 200
        yield address[0]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)


def run(args: list[str] | str, cwd: Path, env: dict[str, str], *, shell: bool = False) -> subprocess.CompletedProcess:
    argv = ["bash", "-c", args] if shell else args
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
                          stdin=subprocess.DEVNULL)


def explain(snippet: Snippet, text: str, done: subprocess.CompletedProcess) -> str:
    return (f"{snippet.id} exited {done.returncode}\n--- ran:\n{text}\n--- stdout (end):\n{done.stdout[-3000:]}"
            f"\n--- stderr (end):\n{done.stderr[-3000:]}")


def with_server(snippet: Snippet, request) -> str:
    """The snippet's text, pointed at the fixture's server when it names the documented address."""
    if not snippet.uses_server:
        return snippet.text
    address = request.getfixturevalue("doc_server")
    return snippet.text.replace(DOC_PORT, address).replace("localhost:30000", address)


def skip_unless_runnable(snippet: Snippet) -> None:
    if snippet.key in ALLOWED:
        pytest.skip(f"allow-listed: {ALLOWED[snippet.key]}")
    module = NEEDS.get(snippet.key)
    if module and importlib.util.find_spec(module) is None:
        pytest.skip(f"needs {module}, not installed (CI installs it: .ci/run)")


# ---------------------------------------------------------------------------------------------- the tests

@pytest.mark.parametrize("snippet", _params("shell"))
def test_shell_command(snippet: Snippet, scratch, env, request):
    skip_unless_runnable(snippet)
    text = with_server(snippet, request)
    done = run(text, scratch, env, shell=True)
    assert done.returncode == 0, explain(snippet, text, done)
    if snippet.uses_server:  # curl -s exits 0 on an HTTP error: the reply itself must not be one
        with contextlib.suppress(ValueError):
            reply = json.loads(done.stdout)
            assert not (isinstance(reply, dict) and "error" in reply), explain(snippet, text, done)


@pytest.mark.parametrize("snippet", _params("python"))
def test_python_snippet(snippet: Snippet, scratch, env, request):
    skip_unless_runnable(snippet)
    text = with_server(snippet, request)
    script = scratch / f"snippet_{snippet.path.replace('/', '_')}_{snippet.line}.py"
    script.write_text(text)
    done = run([sys.executable, script.name], scratch, env)
    assert done.returncode == 0, explain(snippet, text, done)


@cache
def help_flags(command: tuple[str, ...]) -> frozenset[str]:
    """The flags ``COMMAND --help`` lists (``("pytest",)`` or ``("dsa-runtime", SUBCOMMAND)``)."""
    if command[0] == "pytest":
        argv = [sys.executable, "-m", "pytest", "--help"]
    else:
        argv = [sys.executable, "-m", "dsa_runtime.cli.main", *command[1:], "--help"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, f"{' '.join(command)} --help exited {done.returncode}: {done.stderr[-2000:]}"
    return frozenset(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", done.stdout))


def named_flags(usage: str) -> list[str]:
    """The flags a usage line names; ``--[no-]x`` stands for ``--x`` and ``--no-x``."""
    flags = []
    for prefix, neg, name in re.findall(r"(?<![\w-])(--?)(\[no-\])?([A-Za-z][\w-]*)", usage):
        flags.append(prefix + name)
        if neg:
            flags.append(prefix + "no-" + name)
    return flags


def check_usage(usage: str) -> None:
    words = strip_comment(usage).split()
    program = words[0].rsplit("/", 1)[-1]
    if program == "pytest":
        missing = [f for f in named_flags(" ".join(words[1:])) if f not in help_flags(("pytest",))]
        assert not missing, f"pytest --help lists no {missing}"
        return
    assert program == "dsa-runtime", f"a synopsis of {program!r}: teach test_snippets.py to check it"
    rest = words[1:]
    n_top = next((i for i, w in enumerate(rest) if not w.startswith("-")), len(rest))
    top, commands = rest[:n_top], (rest[n_top] if n_top < len(rest) else "").split("|")
    missing = [f for f in named_flags(" ".join(top)) if f not in help_flags(("dsa-runtime",))]
    assert not missing, f"dsa-runtime --help lists no {missing}"
    after = " ".join(rest[n_top + 1:])
    for command in commands:
        flags = help_flags(("dsa-runtime", command))  # also fails for an unknown command
        missing = [f for f in named_flags(after) if f not in flags]
        assert not missing, f"dsa-runtime {command} --help lists no {missing}"


@pytest.mark.parametrize("snippet", _params("synopsis"))
def test_synopsis_names_real_commands_and_flags(snippet: Snippet):
    check_usage(snippet.text)


@cache
def cli_parser():
    from dsa_runtime.cli.main import build_parser

    return build_parser()


@pytest.mark.parametrize("snippet", _params("inline"))
def test_inline_command_parses(snippet: Snippet):
    if re.search(r"\[|\.\.\.|<", snippet.text):  # placeholders: only the command and its flags can be checked
        check_usage(snippet.text)
        return
    span = snippet.text.split(" | ")[0]  # `dsa-runtime plugins | grep deepgemm`: the dsa-runtime part
    argv = shlex.split(span)[1:]
    if len(argv) == 1:  # `dsa-runtime make-checkpoint` names a command; it is not an invocation
        check_usage(span)
        return
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli_parser().parse_args(argv)
        except SystemExit as exc:  # --help exits 0; a bad argument exits 2 with argparse's message
            assert exc.code == 0, f"{snippet.id}: `{span}` does not parse: {err.getvalue().strip()}"


@pytest.mark.parametrize("snippet", _params("json") + _params("toml"))
def test_data_snippet_parses(snippet: Snippet):
    if snippet.kind == "json":
        json.loads(snippet.text)
        return
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python >= 3.11")
    tomllib.loads(snippet.text)


_COMMAND_WORDS = re.compile(r"^\s*(\$ )?(\.venv/bin/)?(dsa-runtime|python3?|pip|pytest|curl|torchrun)\s")


def test_text_blocks_hold_no_commands():
    """```text is for diagrams: a command hidden there would never run."""
    hidden = [f"{s.id}: {line.strip()}" for s in SNIPPETS if s.kind == "text"
              for line in s.text.splitlines() if _COMMAND_WORDS.match(line)]
    assert not hidden, "commands in ```text blocks (make them sh, or allow-list them):\n" + "\n".join(hidden)


def test_every_listed_snippet_is_in_the_docs():
    keys = {s.key for s in SNIPPETS}
    for name, table in (("ALLOWED", ALLOWED), ("NEEDS", NEEDS), ("SLOW", SLOW)):
        gone = [key for key in table if key not in keys]
        assert not gone, f"{name} lists snippets no longer in the docs (update the table): {gone}"
    assert all(reason.strip() for reason in ALLOWED.values())


@pytest.mark.parametrize("path", DOC_FILES)
def test_extraction_sees_every_fenced_block(path: str):
    """A guard on the extractor itself: every fence line of the file opens or closes a block it extracted."""
    text = (REPO / path).read_text(encoding="utf-8")
    fence_lines = [line for line in text.splitlines() if re.fullmatch(r"\s*(`{3,}|~{3,})[\w-]*\s*", line)]
    assert len(fence_lines) == 2 * sum(fenced for *_, fenced in code_blocks(text))


def test_readme_first_line(doc_server, scratch, env):
    """The parts of README's first line that CI does not run: `generate`, and the client beside the server.

    The line is ``SETUP && generate ... && (serve & client; wait)``: SETUP must be what .ci/run runs; the
    generate command runs as written; the client runs against the fixture's ``dsa-runtime serve`` (the same
    command), given that server's URL as its documented argument.
    """
    first = next(s for s in SNIPPETS if s.path == "README.md" and s.kind == "shell")
    ci = re.search(r"^SETUP='(.*)'$", (REPO / ".ci/run").read_text(), re.M)
    assert ci, ".ci/run no longer defines SETUP"
    assert first.text.startswith(ci.group(1) + " && "), "README's first line no longer starts with CI's set-up"
    *middle, last = first.text[len(ci.group(1)) + 4:].split(" && ")
    for command in middle:
        done = run(command, scratch, env, shell=True)
        assert done.returncode == 0, explain(first, command, done)
    m = re.fullmatch(r"\((\S+ serve) & (.+); wait\)", last)
    assert m and m.group(1) == ".venv/bin/dsa-runtime serve", f"unexpected end of README's first line: {last}"
    client = f"{m.group(2)} http://{doc_server}/v1"
    done = run(client, scratch, env, shell=True)
    assert done.returncode == 0, explain(first, client, done)
