"""Discovery, allow/block lists, failure reporting, duplicates and tracing of the plugin manager."""

from __future__ import annotations

import pytest

from dsa_runtime.errors import ConfigError
from dsa_runtime.hookspecs import hookimpl
from dsa_runtime.plugin_manager import DSAPluginManager, get_manager

from .fake_plugins import backend, make_plugin, plugin_registering

BUILTIN_BACKEND_PLUGINS = {"reference", "cuda_hopper", "cuda_blackwell", "rocm", "npu"}


def test_builtins_are_discovered_through_entry_points():
    manager = get_manager()
    loaded = {name for name, r in manager.reports.items() if r.status == "loaded"}
    assert loaded >= BUILTIN_BACKEND_PLUGINS
    assert all(manager.reports[n].source.startswith("dsa-runtime") for n in BUILTIN_BACKEND_PLUGINS)
    assert set(manager.platforms) >= {"cpu", "cuda_hopper", "cuda_blackwell", "rocm", "npu"}
    assert manager.backends["reference"].plugin == "reference"


def test_allow_list_from_environment(monkeypatch):
    monkeypatch.setenv("DSA_PLUGINS", "reference")
    manager = DSAPluginManager.from_env().load()
    assert manager.reports["reference"].status == "loaded"
    assert manager.reports["cuda_hopper"].status == "not-allowed"
    assert "cuda_hopper" not in manager.platforms


def test_empty_allow_list_loads_nothing(monkeypatch):
    monkeypatch.setenv("DSA_PLUGINS", "")
    manager = DSAPluginManager.from_env().load()
    assert not manager.backends and not manager.platforms
    with pytest.raises(ConfigError, match="not in the DSA_PLUGINS"):
        manager.get_backend("reference")


def test_block_list_from_environment_and_cli(monkeypatch, capsys):
    monkeypatch.setenv("DSA_BLOCK_PLUGINS", "rocm")
    manager = DSAPluginManager.from_env().load()
    assert manager.reports["rocm"].status == "blocked"
    assert "rocm" not in manager.platforms and manager.pm.is_blocked("rocm")

    from dsa_runtime.cli.main import main
    from dsa_runtime.plugin_manager import reset_manager

    reset_manager()
    main(["--block-plugin", "npu", "plugins", "--json"])
    out = capsys.readouterr().out
    assert '"status": "blocked"' in out
    assert get_manager().reports["npu"].status == "blocked"


def test_import_failure_is_reported_with_reason(monkeypatch):
    manager = DSAPluginManager()

    def broken():
        raise ImportError("libfoo.so: cannot open shared object file")

    manager._register("vendor_x", "dsa_runtime.plugins", "vendor-x 1.0", broken)
    manager.collect()
    report = manager.reports["vendor_x"]
    assert report.status == "failed"
    assert "ImportError" in report.reason and "libfoo.so" in report.reason


def test_registration_failure_drops_partial_registrations():
    manager = DSAPluginManager()

    @hookimpl
    def dsa_register_backends(register):
        register(backend("half"))
        raise RuntimeError("vendor library version mismatch")

    manager.add_plugin(make_plugin(dsa_register_backends=dsa_register_backends), "half_plugin")
    manager.collect()
    assert manager.reports["half_plugin"].status == "failed"
    assert "version mismatch" in manager.reports["half_plugin"].reason
    assert "half" not in manager.backends


def test_wrong_object_registered_is_a_failure():
    manager = DSAPluginManager()

    @hookimpl
    def dsa_register_backends(register):
        register({"name": "dict-is-not-a-backend"})

    manager.add_plugin(make_plugin(dsa_register_backends=dsa_register_backends), "sloppy")
    manager.collect()
    assert manager.reports["sloppy"].status == "failed"
    assert "expects a Backend" in manager.reports["sloppy"].reason


def test_duplicate_backend_name_is_rejected_naming_both_plugins():
    manager = DSAPluginManager()
    manager.add_plugin(plugin_registering(backend("fast")), "first")
    manager.add_plugin(plugin_registering(backend("fast", families=("topk", "moe"))), "second")
    manager.collect()
    assert manager.backends["fast"].plugin == "first"
    (problem,) = manager.reports["second"].problems
    assert "backend 'fast' rejected" in problem and "'first'" in problem


def test_duplicate_plugin_name_is_rejected():
    manager = DSAPluginManager()
    manager.add_plugin(plugin_registering(backend("a")), "same", source="dist-a 1.0")
    manager.add_plugin(plugin_registering(backend("b")), "same", source="dist-b 2.0")
    manager.collect()
    rejected = [r for r in manager.reports.values() if r.status == "rejected"]
    assert len(rejected) == 1 and "dist-a 1.0" in rejected[0].reason
    assert "b" not in manager.backends


def test_unknown_hook_name_is_caught():
    manager = DSAPluginManager()

    @hookimpl
    def dsa_register_backend(register):  # typo: missing "s"
        pass

    manager.add_plugin(make_plugin(dsa_register_backend=dsa_register_backend), "typo")
    manager.collect()
    assert manager.reports["typo"].status == "failed"
    assert "unknown hook" in manager.reports["typo"].reason


def test_hook_call_tracing(capsys):
    manager = DSAPluginManager(allow=["reference"], trace=True).load()
    err = capsys.readouterr().err
    assert "dsa_register_backends" in err and manager.backends


def test_unknown_backend_lists_the_valid_names():
    with pytest.raises(ConfigError, match=r"unknown backend 'nope'; registered backends: .*reference"):
        get_manager().get_backend("nope")


def test_plugins_cli_shows_every_builtin_with_reasons(capsys, no_gpu):
    from dsa_runtime.cli.main import main

    main(["plugins"])
    out = capsys.readouterr().out
    for name in BUILTIN_BACKEND_PLUGINS:
        assert f"\n{name}  [dsa_runtime.plugins]" in "\n" + out
    assert "platform cuda_hopper: absent" in out
    assert "families provided: none" in out
    assert "no Blackwell kernel yet" in out  # platforms without native kernels say so per family
    assert "backend reference: available" in out


def test_discovery_and_detection_import_nothing_heavy():
    """Listing plugins and probing hardware must not import torch or any kernel library."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from dsa_runtime.plugin_manager import get_manager\n"
        "m = get_manager()\n"
        "[p.detect() for p in m.platforms.values()]\n"
        "[b.available() for b in m.backends.values()]\n"
        "import dsa_runtime.testing.pytest_plugin, dsa_runtime.cli.main\n"
        "heavy = sorted(n for n in ('torch', 'triton', 'flash_mla', 'deep_gemm', 'tilelang') if n in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "", f"imported at discovery: {run.stdout.strip()}"


def test_plugins_resolve_with_explicit_settings(capsys, no_gpu):
    from dsa_runtime.cli.main import main

    assert main(["plugins", "--resolve", "--set", "topk=reference", "--set", "kv_layout=fp8_656"]) == 0
    out = capsys.readouterr().out
    assert "resolved on this machine: platform cpu, device cpu, KV fp8_656" in out
    for method in ("topk.topk", "topk.page_table_transform", "topk.topk_transform"):  # one line per method
        assert f"    {method:<28} -> reference (chosen for topk)\n" in out
    assert "    sparse_attn.decode           -> torch (cpu default: torch first" in out

    assert main(["plugins", "--resolve", "--set", "moe=nope"]) == 2
    assert "unknown backend 'nope'" in capsys.readouterr().err
    assert main(["plugins", "--resolve", "--set", "colour=blue"]) == 2
    assert "expected KEY=VALUE with KEY one of platform, device" in capsys.readouterr().err
    assert main(["plugins", "--set", "topk=reference"]) == 2
    assert "--set only makes sense with --resolve" in capsys.readouterr().err
