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

TIMEOUT_S = 300

# (file, command as written with its comment and line breaks removed) -> why it does not run in CI.
ALLOWED: dict[tuple[str, str], str] = {
    ("README.md",
     'python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e ".[server,test]" '
     "-e examples/dsa-example-backend && .venv/bin/dsa-runtime generate --chat \"What is 47 + 38?\" --thinking "
     "--temperature 0 && (.venv/bin/dsa-runtime serve & .venv/bin/python examples/tiny_chat_client.py; wait)"):
        "the set-up line: .ci/run runs its venv + pip part on a clean clone, and it ends by leaving the server "
        "in the foreground; test_readme_first_line runs its other parts",
    ("README.md", ".venv/bin/python -m pytest"): "the whole suite: CI runs it (.ci/run); here it would recurse",
    ("README.md", "pip install dsa-runtime"): "installs from PyPI (network, changes the environment)",
    ("README.md", 'pip install "dsa-runtime[hopper]"'): "installs from PyPI (network, changes the environment)",
    ("README.md", 'pip install "dsa-runtime[blackwell]"'): "installs from PyPI (network, changes the environment)",
    ("README.md", 'pip install "dsa-runtime[rocm]"'): "installs from PyPI (network, changes the environment)",
    ("README.md", 'pip install "dsa-runtime[npu]"'): "installs from PyPI (network, changes the environment)",
    ("README.md", 'pip install "dsa-runtime[server]"'): "installs from PyPI (network, changes the environment)",
    ("README.md", 'pip install "dsa-runtime[all]"'): "installs from PyPI (network, changes the environment)",
    ("README.md", 'pip install "dsa-runtime[eval]"'): "installs from PyPI (network, changes the environment)",
    ("docs/eval.md", "dsa-runtime serve --model /ckpt/DeepSeek-V3.2 --tp 8"):
        "8 GPUs and the DeepSeek-V3.2 checkpoint at /ckpt",
    ("docs/eval.md", "dsa-runtime eval --base-url http://127.0.0.1:30000/v1 --data gsm8k --num-shots 5 --parallel 128 "
                     "--min-accuracy 0.95"):
        "downloads gsm8k (network) and needs the DeepSeek-V3.2 server above",
    ("docs/running-benchmarks.md", "python bench/sparse_attn_triton.py --sweep"): "GPU benchmark (CUDA, ~4 min on an H100)",
    ("docs/running-benchmarks.md", "python bench/serve_vs_engine.py --client openai --servers process --concurrency 64 1 64 "
                                   "128"): "GPU benchmark (the embedded model on one CUDA device, a few minutes)",
    ("docs/running-benchmarks.md", "python bench/prefill_real_gpu.py --json bench/results/prefill_real_gpu.json"):
        "GPU benchmark (CUDA, under 7 minutes on an H100 with --budget-s 420)",
    ("docs/distributed.md", "dsa-runtime serve --model /ckpt/DeepSeek-V3.2 --tp 8"):
        "8 GPUs and the DeepSeek-V3.2 checkpoint at /ckpt",
    ("docs/distributed.md", "dsa-runtime serve --model /ckpt/DeepSeek-V3.2 --tp 8 --dp 4 --enable-dp-attention"):
        "8 GPUs and the DeepSeek-V3.2 checkpoint at /ckpt",
    ("docs/distributed.md",
     "dsa-runtime serve --model /ckpt/DeepSeek-V3.2 --tp 8 --dp 8 --enable-dp-attention --ep-size 8"):
        "8 GPUs and the DeepSeek-V3.2 checkpoint at /ckpt",
    ("docs/distributed.md", "dsa-runtime serve --model /ckpt/DeepSeek-V3.2 --tp 8 --ep-size 8"):
        "8 GPUs and the DeepSeek-V3.2 checkpoint at /ckpt",
    ("docs/distributed.md",
     "dsa-runtime serve --model M --tp 16 --nnodes 2 --node-rank 0 --dist-init-addr 10.0.0.1:5000"):
        "multi-node: two GPU hosts, node 0 at 10.0.0.1, a checkpoint M",
    ("docs/distributed.md",
     "dsa-runtime serve --model M --tp 16 --nnodes 2 --node-rank 1 --dist-init-addr 10.0.0.1:5000"):
        "multi-node: two GPU hosts, node 0 at 10.0.0.1, a checkpoint M",
    ("docs/hopper.md", "tools/gpu/build_flashmla.sh"):
        "GPU host: builds FlashMLA (CUDA >= 12.8 nvcc) from the .gpu-deps/ tarball tools/gpu/pack_flashmla.sh makes",
    ("docs/hopper.md", "source .gpu-deps/flashmla.env"): "GPU host: the file is written by the FlashMLA build",
    ("docs/hopper.md", "git clone --bare https://github.com/deepseek-ai/FlashMLA.git ../FlashMLA.git"):
        "clones from GitHub (network), beside the checkout",
    ("docs/hopper.md", "git clone --bare https://github.com/deepseek-ai/DeepGEMM.git ../DeepGEMM.git"):
        "clones from GitHub (network), beside the checkout",
    ("docs/hopper.md", "git clone --bare https://github.com/fmtlib/fmt.git ../fmt.git"):
        "clones from GitHub (network), beside the checkout",
    ("docs/hopper.md", "tools/gpu/pack_flashmla.sh ../FlashMLA.git"):
        "reads the FlashMLA clone made above and downloads CUTLASS headers from PyPI (network)",
    ("docs/hopper.md", "tools/gpu/pack_tilelang.sh"): "downloads wheels from PyPI (network)",
    ("docs/hopper.md", "tools/gpu/wheels.sh unpack .gpu-deps/tilelang .gpu-deps/tilelang-site"):
        "GPU host: unpacks what tools/gpu/pack_tilelang.sh wrote into .gpu-deps/",
    ("docs/hopper.md", "tools/gpu/pack_tilelang.sh && tools/gpu/pack_flashmla.sh ../FlashMLA.git"):
        "downloads wheels and CUTLASS headers (network) and reads the FlashMLA clone",
    ("docs/hopper.md", "DEEPGEMM_GIT=../DeepGEMM.git FMT_GIT=../fmt.git tools/gpu/pack_deepgemm.sh"):
        "reads the DeepGEMM and fmt clones and downloads CUTLASS headers from PyPI (network)",
    ("docs/hopper.md", "tools/gpu/run_gpu_suite.sh"): "GPU host: the whole GPU suite (CUDA, about 3.5 min on an H200)",
    ("docs/hopper.md", "python bench/attention.py"): "GPU benchmark (CUDA, ~4 min on an H100)",
    ("docs/hopper.md", "PYTHONPATH=.gpu-deps/flashmla-9241ae3:.gpu-deps/wheels python bench/attention.py"):
        "GPU benchmark with FlashMLA and FlagGems built in .gpu-deps/",
    ("docs/tiny-model.md", "python train/train_tiny.py --out run2 --time-budget 400 --batch 32"):
        "training: minutes on a GPU (round 1 of the released weights)",
    ("docs/tiny-model.md",
     "python train/train_tiny.py --out run3 --resume run2 --seed 1 --steps 3200 --batch 32 --no-checkpoint"):
        "training: minutes on a GPU, resumes run2",
    ("docs/tiny-model.md",
     "python train/train_tiny.py --out run4 --init-checkpoint round1 --seed 2 --time-budget 270 --batch 32 "
     "--lr 1.5e-3 --shares 0.4,0.1,0.5 --dense-every 3 --invent 0.35 --no-checkpoint"):
        "training: minutes on a GPU, starts from round 1's weights (round1)",
    ("docs/tiny-model.md",
     "python train/train_tiny.py --out run5 --resume run4 --seed 3 --time-budget 300 --batch 32 --lr 1e-3 "
     "--shares 0.5,0.05,0.45 --dense-every 3 --invent 0.5 --no-checkpoint"):
        "training: minutes on a GPU, resumes run4",
    ("docs/tiny-model.md", "python train/export_tiny.py run5"): "exports run5, the output of the training above",
    ("docs/tiny-model.md", "python train/train_nextn.py --out nextn1 --time-budget 210 --device cuda"):
        "training the NextN layer: minutes on a GPU",
    ("docs/tiny-model.md", "cp nextn1/checkpoint/{config.json,model-0000*-of-00002.safetensors,"
                           "model.safetensors.index.json} core/loader/data/tiny-chat/"):
        "installs nextn1, the output of the training above",
    ("docs/tiny-model.md",
     "python train/train_tiny.py --out run6 --init-checkpoint core/loader/data/tiny-chat --seed 4 --stages sparse "
     "--dense-every 3 --time-budget 210 --batch 32 --lr 5e-4 --json-share 0.25 --invent 0.5 --conversations 100000"):
        "training: about 4 minutes on a GPU (round 3, from the shipped weights)",
    ("docs/tiny-model.md",
     "python train/train_nextn.py --out nextn2 --checkpoint run6/checkpoint --init-mtp core/loader/data/tiny-chat "
     "--json-share 0.25 --lr 1e-3 --time-budget 80 --conversations 40000"):
        "training the NextN layer of run6, the output of the training above: minutes on a GPU",
    ("docs/tiny-model.md", "cp nextn2/checkpoint/{config.json,model-0000*-of-00002.safetensors,"
                           "model.safetensors.index.json} core/loader/data/tiny-chat/"):
        "installs nextn2, the output of the training above",
    ("docs/tiny-model.md",
     "python bench/json_finish.py --model core/loader/data/tiny-chat --out bench/results/json_finish_h100.json"):
        "evaluates round 3 on the GPU after the training above (on the CPU: about 3 minutes, see below)",
    ("docs/tiny-model.md",
     "python bench/tiny_eval.py --model core/loader/data/tiny-chat --n 40 --json bench/results/tiny_eval_h100.json"):
        "evaluates round 3 on the GPU after the training above",
    ("docs/tiny-model.md", "python bench/tiny_eval.py --model core/loader/data/tiny-chat --speculative-algorithm EAGLE "
                           "--n 20 --no-dense --latency 0 --json bench/results/tiny_eval_spec_h100.json"):
        "evaluates round 3's NextN layer on the GPU after the training above",
    ("docs/running-benchmarks.md", "python bench/full_size.py --gpus 2 --layers auto --headroom-gib 6 --output-len 2000 "
                           "--batch1-output 128 --out docs/bench/full_size_h200x2_2026-11-26_tp2_load.json"):
        "GPU benchmark: 2 H200s, about 9 minutes",
    ("docs/running-benchmarks.md", "python bench/full_size.py --gpus 2 --layers auto --headroom-gib 6 --output-len 64 "
                           "--batch1-output 16 --profile-steps 8 --out docs/bench/full_size_h200x2_2026-11-26_profile.json"):
        "GPU benchmark: 2 H200s, about 5 minutes",
    ("docs/running-benchmarks.md", "python bench/full_size.py --gpus 8 --layers 61 --topologies tp --mem-fraction-static 0.95 "
                           "--chunked-prefill-size 4096 --headroom-gib 5 --profile-steps 8 "
                           "--out docs/bench/full_size_h200x8_tp8.json"):
        "GPU benchmark: 8 H200s, 61 layers (run when that machine is lent)",
    ("docs/running-benchmarks.md", "python bench/full_size.py --gpus 8 --layers 61 --topologies dp --mem-fraction-static 0.95 "
                           "--chunked-prefill-size 4096 --headroom-gib 5 --profile-steps 8 "
                           "--out docs/bench/full_size_h200x8_tp8_dp8.json"):
        "GPU benchmark: 8 H200s, 61 layers (run when that machine is lent)",
}

# (file, command) -> module it needs: run when importable, else skipped with that reason (CI installs triton).
NEEDS: dict[tuple[str, str], str] = {
    ("docs/running-benchmarks.md", "TRITON_INTERPRET=1 python bench/sparse_attn_triton.py --sweep --dry-run"): "triton",
}

# (file, command) -> measured time on the 2-core development machine: marked slow (CI runs slow tests too).
SLOW: dict[tuple[str, str], str] = {
    ("docs/running-benchmarks.md", ".venv/bin/python bench/serve_load.py --concurrency 1 4 --requests-per-client 1 "
                           "--max-tokens 16"): "about 15 s",
    ("docs/running-benchmarks.md", ".venv/bin/python bench/frontend_capacity.py --clients 1 8 --requests-per-client 1 "
                           "--max-tokens 16 --warmup 0"): "about 10 s",
    ("docs/running-benchmarks.md", ".venv/bin/python bench/prefill_real_gpu.py --dry-run"): "about 30 s",
    ("docs/running-benchmarks.md", "python bench/full_size.py --plan-only --gpus 8 --layers 61 --gpu-memory-gib 139.8 "
                           "--mem-fraction-static 0.95 --chunked-prefill-size 4096 --headroom-gib 5 --topologies tp,dp,ep,dpep"):
        "about 60 s",
    ("docs/running-benchmarks.md", "TRITON_INTERPRET=1 python bench/sparse_attn_triton.py --sweep --dry-run"): "about 20 s",
    ("README.md", "dsa-runtime eval --in-process --data tinychat-tools --num-questions 8"): "about 25 s",
    ("docs/eval.md", "dsa-runtime eval --in-process --data tinychat-arith --num-questions 40 --min-accuracy 0.8"):
        "about 15 s",
    ("docs/eval.md", "dsa-runtime eval --base-url http://127.0.0.1:30000/v1 --data tinychat-tools --num-questions 4 "
                     "--parallel 4"): "about 15 s",
}


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
