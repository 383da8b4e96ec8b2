"""The example third-party plugin (examples/dsa-example-backend), pip-installed beside dsa-runtime."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dsa_runtime.plugin_manager import get_manager

try:
    importlib.metadata.distribution("dsa-example-backend")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - README's set-up installs it
    pytest.skip(
        "the example plugin is not installed: pip install -e examples/dsa-example-backend", allow_module_level=True
    )


def test_example_plugin_is_discovered_through_its_entry_point():
    manager = get_manager()
    report = manager.reports["example"]
    assert report.status == "loaded", report.reason
    assert report.source.startswith("dsa-example-backend ")
    backend = manager.get_backend("example_topk")
    assert backend.plugin == "example"
    assert set(backend.kernels) == {"topk"}


def test_example_backend_passes_the_conformance_kit():
    from dsa_runtime.testing import run_conformance

    report = run_conformance("example_topk", device="cpu", progress=False)
    families = report.by_family()
    assert report.ok, [r.message for r in report.cases if r.status in ("failed", "error")]
    assert families["topk"]["passed"] >= 10 and families["topk"]["not_claimed"] == 0
    for family in ("indexer", "sparse_attn", "kv_quant", "moe"):
        assert families[family]["passed"] == 0
        unclaimed = [r for r in report.cases if r.family == family]
        assert unclaimed and all(r.status == "not_claimed" and "top-k only" in r.message for r in unclaimed)


def test_example_conformance_through_the_cli(tmp_path: Path):
    out = tmp_path / "example.json"
    cli = Path(sys.executable).with_name("dsa-runtime")
    # The console script when pip installed one beside the interpreter, else the same entry point as a module
    # (a --target install, as on the GPU machine, writes no scripts).
    command = [str(cli)] if cli.exists() else [sys.executable, "-m", "dsa_runtime.cli.main"]
    run = subprocess.run(
        [*command, "conformance", "example_topk", "--family", "topk", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    data = json.loads(out.read_text())
    assert data["backend"] == "example_topk" and data["summary"]["failed"] == 0 and data["summary"]["passed"] > 0
