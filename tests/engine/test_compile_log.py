"""``DSA_LOG_COMPILES``: the Triton compile hook is installed only when asked, observes without skipping, and
prints one line per compile; other watchers (the benches) see the same compiles beside it."""

from __future__ import annotations

import pytest

from dsa_runtime.engine import compile_log
from dsa_runtime.engine.compile_log import install_compile_log, watch_compiles

knobs = pytest.importorskip("triton").knobs


@pytest.fixture
def restore_hook():
    before, watchers = knobs.runtime.jit_cache_hook, list(compile_log._watchers)
    compile_log._watchers.clear()
    yield
    knobs.runtime.jit_cache_hook = before
    compile_log._watchers[:] = watchers


@pytest.mark.parametrize("value", ["", "0"])
def test_not_installed_unless_asked(monkeypatch, restore_hook, value):
    monkeypatch.setenv("DSA_LOG_COMPILES", value)
    knobs.runtime.jit_cache_hook = None
    assert install_compile_log() is False and knobs.runtime.jit_cache_hook is None


def test_one_line_per_compile_and_never_skips(monkeypatch, restore_hook, capsys):
    monkeypatch.setenv("DSA_LOG_COMPILES", "1")
    assert install_compile_log() is True
    hook = knobs.runtime.jit_cache_hook
    assert hook(key=None, repr="gemm_up[num_warps=4](x: *bf16, n: i32)", fn=None, compile={},
                is_manual_warmup=False, already_compiled=False) is False
    err = capsys.readouterr().err
    assert err.startswith("dsa-runtime: Triton compile +") and "gemm_up[num_warps=4](x: *bf16, n: i32)" in err
    assert err.count("\n") == 1


def test_a_watcher_and_the_printer_both_see_each_compile(monkeypatch, restore_hook, capsys):
    seen: list[tuple[str, str]] = []
    assert watch_compiles(lambda name, variant: seen.append((name, variant))) is True
    monkeypatch.setenv("DSA_LOG_COMPILES", "1")
    assert install_compile_log() is True  # added beside the watcher, not in its place

    class Fn:
        name = "gemm_down"

    hook = knobs.runtime.jit_cache_hook
    assert hook(key=None, repr="gemm_down[num_warps=8](h: *bf16)", fn=Fn(), compile={}, is_manual_warmup=False,
                already_compiled=False) is False
    assert seen == [("gemm_down", "gemm_down[num_warps=8](h: *bf16)")]
    assert "gemm_down[num_warps=8](h: *bf16)" in capsys.readouterr().err
