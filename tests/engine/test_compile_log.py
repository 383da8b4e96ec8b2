"""``DSA_LOG_COMPILES``: the Triton compile hook is installed only when asked, observes without skipping, and
prints one line per compile."""

from __future__ import annotations

import pytest

from dsa_runtime.engine.compile_log import install_compile_log

knobs = pytest.importorskip("triton").knobs


@pytest.fixture
def restore_hook():
    before = knobs.runtime.jit_cache_hook
    yield
    knobs.runtime.jit_cache_hook = before


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
