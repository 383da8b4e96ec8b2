"""The built wheel holds only the dsa_runtime namespace and declares the entry points plugins rely on."""

from __future__ import annotations

import configparser
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("dsa_runtime-*.whl")
    return built


def test_wheel_holds_only_the_dsa_runtime_namespace(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert all(t == "dsa_runtime" or t.endswith(".dist-info") for t in tops), sorted(tops)
    for module in (
        "dsa_runtime/__init__.py",
        "dsa_runtime/families.py",
        "dsa_runtime/reference/plugin.py",
        "dsa_runtime/testing/pytest_plugin.py",
        "dsa_runtime/plugins/cuda_hopper/__init__.py",
        "dsa_runtime/plugins/npu/__init__.py",
        "dsa_runtime/parsers/plugin.py",
        "dsa_runtime/loader/export.py",
    ):
        assert module in names, module
    # The synthetic chat generator is training code (train/tinychat): the runtime ships only its results (the
    # embedded model, the held-out eval sets).
    assert not any("tinychat" in n or n.startswith("train/") for n in names), [n for n in names if "tinychat" in n]
    assert {"dsa_runtime/evals/data/tiny-chat-arith.jsonl", "dsa_runtime/evals/data/tiny-chat-tools.jsonl"} <= set(names)
    assert any(n.startswith("dsa_runtime/parsers/templates/") and n.endswith(".jinja") for n in names)


def test_wheel_declares_entry_points(wheel):
    with zipfile.ZipFile(wheel) as zf:
        (ep_name,) = [n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")]
        parser = configparser.ConfigParser()
        parser.read_string(zf.read(ep_name).decode())
    assert dict(parser["dsa_runtime.plugins"]) == {
        "reference": "dsa_runtime.reference.plugin",
        "cuda_hopper": "dsa_runtime.plugins.cuda_hopper",
        "cuda_blackwell": "dsa_runtime.plugins.cuda_blackwell",
        "rocm": "dsa_runtime.plugins.rocm",
        "npu": "dsa_runtime.plugins.npu",
    }
    assert parser["dsa_runtime.parsers"]["deepseek"] == "dsa_runtime.parsers.plugin"
    assert parser["pytest11"]["dsa_runtime"] == "dsa_runtime.testing.pytest_plugin"
    assert parser["console_scripts"]["dsa-runtime"] == "dsa_runtime.cli.main:main"


def test_wheel_extras_name_the_fields_packages(wheel):
    with zipfile.ZipFile(wheel) as zf:
        (meta_name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        meta = zf.read(meta_name).decode()
    extras = {line.split(": ", 1)[1] for line in meta.splitlines() if line.startswith("Provides-Extra: ")}
    assert extras == {"hopper", "blackwell", "rocm", "npu", "server", "structured", "eval", "test", "all"}
    for requirement in ("sgl-flash-mla", "sgl-deep-gemm", "tilelang", "amd-aiter", "torch-npu", "fastapi", "triton", "xgrammar",
                        "openai"):
        assert requirement in meta
    # Nothing imports FlashInfer: an extra that installed it would download it for nothing.
    assert "flashinfer" not in meta


def test_ci_installs_nothing_beyond_readmes_set_up():
    """A green CI must mean a newcomer's run of README's two commands is green: .ci/run may install only
    through README's set-up line, and the suite's optional imports come from the extras that line names."""
    ci = (ROOT / ".ci" / "run").read_text()
    installs = [line for line in ci.splitlines()
                if ("pip install" in line or "apt-get install" in line) and not line.startswith("SETUP=")]
    assert not installs, f".ci/run installs beyond README's set-up: {installs}"
    setup = next(line for line in ci.splitlines() if line.startswith("SETUP="))
    assert setup.split("=", 1)[1].strip("'") in (ROOT / "README.md").read_text()
    assert '".[server,test]"' in setup


def test_test_extra_holds_what_the_suite_imports():
    """The interpreter tests import triton (and its interpreter needs numpy < 2.3): both are in the test extra."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {req.split(";")[0].split("=")[0].split("<")[0].split(">")[0].strip() for req in extras["test"]}
    assert {"pytest", "triton", "numpy", "httpx", "openai", "xgrammar", "jsonschema"} <= names
