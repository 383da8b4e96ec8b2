"""Per-method resolution: prefill and decode from different backends, fallbacks logged, explicit errors."""

from __future__ import annotations

import importlib.util
import logging

import pytest

from dsa_runtime.backend import Backend
from dsa_runtime.capabilities import Capabilities, MethodClaim, ValueSet
from dsa_runtime.errors import ConfigError
from dsa_runtime.resolve import KernelConfig, resolve_kernels

from .fake_plugins import TopKOnly
from .test_resolve import manager_with


@pytest.fixture(autouse=True)
def _cpu_only(no_gpu):
    """A CPU-only host unless a test sets DSA_FAKE_GPU."""


def method_backend(name, claims, devices=("cpu",), not_claimed=None):
    families = {m.split(".")[0] for m in claims}
    return Backend(
        name=name,
        capabilities=Capabilities(devices=frozenset(devices), methods=claims, not_claimed=not_claimed or {}),
        kernels=dict.fromkeys(families, type(f"{name}_kernels", (TopKOnly,), {})),
    )


def prefill_only(name="prefill_only", devices=("cpu",)):
    return method_backend(name, {"sparse_attn.prefill": MethodClaim(kv_layouts=ValueSet.one_of("bf16"))}, devices,
                          {"sparse_attn.decode": "prefill-only library"})


def decode_only(name="decode_only", layouts=("bf16", "fp8_656"), devices=("cpu",)):
    return method_backend(name, {"sparse_attn.decode": MethodClaim(kv_layouts=ValueSet.one_of(*layouts))}, devices)


def test_prefill_and_decode_from_different_backends_keep_call_sites():
    config = KernelConfig(sparse_attn_prefill="prefill_only", sparse_attn_decode="decode_only")
    resolved = resolve_kernels(config, manager=manager_with(prefill_only(), decode_only()))
    assert resolved.backend_of("sparse_attn.prefill") == "prefill_only"
    assert resolved.backend_of("sparse_attn.decode") == "decode_only"
    assert resolved.choices["sparse_attn.decode"].reason == "chosen explicitly"
    view = resolved.sparse_attn
    assert type(view.prefill.__self__).__name__ == "prefill_only_kernels"
    assert type(view.decode.__self__).__name__ == "decode_only_kernels"
    assert view.backends == {"prefill": "prefill_only", "decode": "decode_only"}
    assert "prefill=prefill_only" in repr(view)
    # the generic per-method mapping does the same, and other families stay on the cpu default (torch)
    same = resolve_kernels(KernelConfig(methods={"sparse_attn.prefill": "prefill_only", "sparse_attn.decode": "decode_only"}),
                           manager=manager_with(prefill_only(), decode_only()))
    assert same.sparse_attn.backends == view.backends and same.backend_of("topk.topk_transform") == "torch"


def test_family_choice_falls_back_for_a_method_the_backend_lacks(caplog):
    caplog.set_level(logging.INFO, logger="dsa_runtime.resolve")
    resolved = resolve_kernels(KernelConfig(sparse_attn="prefill_only"), manager=manager_with(prefill_only()))
    assert resolved.choices["sparse_attn.prefill"].reason == "chosen for sparse_attn"
    decode = resolved.choices["sparse_attn.decode"]
    # the method falls back along the cpu platform's preference list: torch first
    assert decode.backend == "torch" and "prefill-only library" in decode.reason and "fallback" in decode.reason
    assert any(r.getMessage().startswith("sparse_attn.decode -> torch (fallback: ") for r in caplog.records)


def test_explicit_method_the_backend_lacks_fails_with_reason_and_valid_names():
    manager = manager_with(prefill_only(), decode_only())
    with pytest.raises(ConfigError) as info:
        resolve_kernels(KernelConfig(sparse_attn_decode="prefill_only"), manager=manager)
    msg = str(info.value)
    assert msg.startswith("sparse_attn.decode: backend 'prefill_only': sparse_attn.decode: prefill-only library")
    assert msg.endswith("backends that can run sparse_attn.decode on cpu with bf16 KV: reference, torch, decode_only")
    with pytest.raises(ConfigError, match="KV layout 'fp8_656' not claimed: claims one of \\['bf16'\\]"):
        resolve_kernels(KernelConfig(sparse_attn_decode="decode_only", kv_layout="fp8_656"),
                        manager=manager_with(decode_only(layouts=("bf16",))))
    with pytest.raises(ConfigError, match="two different backends requested"):
        resolve_kernels(KernelConfig(sparse_attn_decode="decode_only", methods={"sparse_attn.decode": "reference"}),
                        manager=manager)
    with pytest.raises(ConfigError, match="unknown kernel methods sparse_attn.forward"):
        resolve_kernels(KernelConfig(methods={"sparse_attn.forward": "reference"}), manager=manager)


def test_prefill_always_reads_bf16_so_an_fp8_cache_does_not_block_it():
    resolved = resolve_kernels(KernelConfig(sparse_attn_prefill="prefill_only", kv_layout="fp8_656"),
                               manager=manager_with(prefill_only()))
    assert resolved.backend_of("sparse_attn.prefill") == "prefill_only" and resolved.kv_layout == "fp8_656"


def test_auto_uses_the_platform_preference_per_method(monkeypatch):
    # The real FlashMLA adapters (cuda_hopper), made available by a stand-in flash_mla; fa3 is a fake.
    import sys

    from tests.hopper import fake_flash_mla

    monkeypatch.setitem(sys.modules, "flash_mla", fake_flash_mla.make())
    monkeypatch.setenv("DSA_FAKE_GPU", "NVIDIA H200:9.0")
    fa3 = decode_only("fa3", layouts=("bf16",), devices=("cuda",))
    resolved = resolve_kernels(manager=manager_with(fa3))
    assert (resolved.platform, resolved.kv_layout) == ("cuda_hopper", "bf16")
    assert resolved.choices["sparse_attn.prefill"].backend == "flashmla_sparse"
    assert resolved.choices["sparse_attn.prefill"].reason.startswith("cuda_hopper default")
    assert resolved.choices["sparse_attn.decode"].backend == "fa3"
    # without fa3, decode skips flashmla_kv (FP8 cache only) with its reason and lands on our TileLang kernel
    # when tilelang is installed, else on the Triton kernels (the reference without either)
    resolved = resolve_kernels(manager=manager_with())
    decode = resolved.choices["sparse_attn.decode"]
    if importlib.util.find_spec("tilelang") is not None:
        assert decode.backend == "tilelang" and decode.reason.startswith("cuda_hopper default"), decode.reason
        return
    if importlib.util.find_spec("triton") is not None:
        assert decode.backend == "triton" and decode.reason.startswith("cuda_hopper default"), decode.reason
        return
    assert decode.backend == "reference"
    assert "no 'fa3' backend registered" in decode.reason and "KV layout 'bf16' not claimed" in decode.reason


def test_bound_method_missing_from_the_kernel_object_is_a_plugin_error():
    from dsa_runtime.errors import PluginError

    class Half:
        def prefill(self, *a):  # pragma: no cover - never called
            raise AssertionError

    liar = Backend(name="liar", capabilities=Capabilities(methods={"sparse_attn.decode": MethodClaim()}),
                   kernels={"sparse_attn": Half})
    with pytest.raises(PluginError, match="claims sparse_attn.decode but its sparse_attn kernel Half has no method 'decode'"):
        resolve_kernels(KernelConfig(sparse_attn_decode="liar"), manager=manager_with(liar))


def test_cli_sets_prefill_and_decode_separately(capsys, monkeypatch):
    from dsa_runtime.cli import plugins_cmd
    from dsa_runtime.cli.main import main

    manager = manager_with(prefill_only(), decode_only())
    monkeypatch.setattr("dsa_runtime.plugin_manager.get_manager", lambda: manager)
    assert plugins_cmd.parse_settings(["sparse_attn.prefill=a", "topk=b", "sparse_attn_decode=c"]) == {
        "topk": "b", "sparse_attn_decode": "c", "methods": {"sparse_attn.prefill": "a"}}
    code = main(["plugins", "--resolve", "--set", "sparse_attn.prefill=prefill_only",
                 "--set", "sparse_attn.decode=decode_only", "--set", "topk=reference"])
    out = capsys.readouterr().out
    assert code == 0
    assert "    sparse_attn.prefill          -> prefill_only (chosen explicitly)\n" in out
    assert "    sparse_attn.decode           -> decode_only (chosen explicitly)\n" in out
    assert "    topk.topk_transform          -> reference (chosen for topk)\n" in out
    assert main(["plugins", "--resolve", "--set", "sparse_attn.decode=prefill_only"]) == 2
    err = capsys.readouterr().err
    assert "sparse_attn.decode: backend 'prefill_only'" in err and "decode_only" in err
    assert main(["plugins", "--resolve", "--set", "sparse_attn.forward=x"]) == 2
    assert "a method (indexer.quantize_q" in capsys.readouterr().err
    assert plugins_cmd.parse_settings(["heads=128", "scale_fmt=ue8m0"]) == {"needs": {"heads": 128, "scale_fmt": "ue8m0"}}
    assert main(["plugins", "--resolve", "--set", "page_size=16", "--set", "decode_queries=2"]) == 0
    assert "    checked against: page_size 16, decode_queries 2\n" in capsys.readouterr().out


def flashmla_shaped(name="flashmla_like"):
    heads = ValueSet.one_of(64, 128)
    return method_backend(name, {
        "sparse_attn.prefill": MethodClaim(heads=heads, k=ValueSet.multiples(128, 128, 16384)),
        "sparse_attn.decode": MethodClaim(heads=heads, k=ValueSet.multiples(64, 64, 16384), page_sizes={64}),
    })


def test_model_needs_decide_whether_a_backend_fits():
    manager = manager_with(flashmla_shaped())
    fits = resolve_kernels(KernelConfig(sparse_attn="flashmla_like"), manager=manager,
                           needs={"heads": 128, "k": 2048, "decode_queries": 2})
    assert fits.backend_of("sparse_attn.decode") == "flashmla_like"
    assert fits.needs == {"page_size": 64, "heads": 128, "k": 2048, "decode_queries": 2}
    # 4 heads pad to 64 (the caller pads: dsa_runtime.padding); 200 heads fit no claimed count.
    padded = resolve_kernels(KernelConfig(sparse_attn="flashmla_like"), manager=manager,
                             needs={"heads": 4, "k": 32, "page_size": 64})
    assert padded.choices["sparse_attn.prefill"].reason == "chosen for sparse_attn; pads heads 4 -> 64, k 32 -> 128"
    assert padded.choices["sparse_attn.decode"].reason == "chosen for sparse_attn; pads heads 4 -> 64, k 32 -> 64"
    with pytest.raises(ConfigError, match="head count 200 not claimed: claims one of \\[64, 128\\]"):
        resolve_kernels(KernelConfig(sparse_attn="flashmla_like"), manager=manager, needs={"heads": 200})
    with pytest.raises(ConfigError, match="page size 16 not claimed: claims one of \\[64\\]"):
        resolve_kernels(KernelConfig(sparse_attn_decode="flashmla_like"), manager=manager, needs={"page_size": 16})
    # prefill does not use the page size, so only decode is refused
    ok = resolve_kernels(KernelConfig(sparse_attn_prefill="flashmla_like"), manager=manager, needs={"page_size": 16})
    assert ok.backend_of("sparse_attn.prefill") == "flashmla_like"
    with pytest.raises(ConfigError, match="unknown kernel needs head_count"):
        resolve_kernels(manager=manager, needs={"head_count": 4})


def test_auto_skips_a_preferred_backend_the_model_does_not_fit(monkeypatch):
    # The real flashmla_sparse adapter (64/128 heads, k % 128), available through a stand-in flash_mla.
    import sys

    from tests.hopper import fake_flash_mla

    monkeypatch.setitem(sys.modules, "flash_mla", fake_flash_mla.make())
    monkeypatch.setenv("DSA_FAKE_GPU", "NVIDIA H100 80GB HBM3:9.0")
    # Resolution builds the chosen kernels: the triton backend's modules import triton (the test extra has it).
    pytest.importorskip("triton", reason="needs the triton package (pip install -e '.[test]')")
    manager = manager_with()
    huge = resolve_kernels(manager=manager, needs={"heads": 256, "k": 2048})
    prefill = huge.choices["sparse_attn.prefill"]
    assert prefill.backend == "reference" and "head count 256 not claimed" in prefill.reason
    # 4 heads: a later preference that runs them as they are (triton) beats padding them to 64; the reason says
    # what was passed over and why.
    tiny = resolve_kernels(manager=manager, needs={"heads": 4, "k": 32})
    assert tiny.backend_of("sparse_attn.prefill") == "triton"
    assert "flashmla_sparse would pad (pads heads 4 -> 64, k 32 -> 128)" in tiny.choices["sparse_attn.prefill"].reason
    # Without a backend that fits, the padded one is taken (padded, not skipped).
    monkeypatch.setattr(manager.backends["triton"], "available", lambda: (False, "no triton here"))
    alone = resolve_kernels(manager=manager, needs={"heads": 4, "k": 32})
    assert alone.backend_of("sparse_attn.prefill") == "flashmla_sparse"
    assert alone.choices["sparse_attn.prefill"].reason.endswith("pads heads 4 -> 64, k 32 -> 128")
    real = resolve_kernels(manager=manager, needs={"heads": 128, "k": 2048})
    assert real.backend_of("sparse_attn.prefill") == "flashmla_sparse"


def test_resolution_keys_mirror_the_kit_keys():
    from dsa_runtime.kernel_needs import BF16_METHODS, LAYOUT_METHODS, SHAPE_KEYS
    from dsa_runtime.testing.registry import method_keys

    for method, keys in method_keys().items():
        assert set(SHAPE_KEYS[method]) == set(keys) - {"device", "kv_layout"}, method
        assert ("kv_layout" in keys) == (method in LAYOUT_METHODS | BF16_METHODS), method


def test_plugins_lists_partly_claimed_families_per_method(capsys, monkeypatch):
    from dsa_runtime.cli.main import main

    manager = manager_with(prefill_only())
    monkeypatch.setattr("dsa_runtime.plugin_manager.get_manager", lambda: manager)
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "      sparse_attn.prefill: claimed (kv_layouts one of ['bf16'])\n" in out
    assert "      sparse_attn.decode: prefill-only library\n" in out
    assert "      topk.topk: claimed" not in out  # whole families claimed alike are not spelled out


def test_auto_runs_few_head_fp8_decode_unpadded_unless_padding_is_listed_as_cheap(monkeypatch):
    # Measured (H200, bench/fewhead_decode.py): fp8_656 decode at 32 heads, the triton backend (CUDA few-head kernel,
    # two head groups) 0.073 ms against FlashMLA padded to 64's 0.091; at 16 heads 0.049 against 0.091.
    import sys

    from dsa_runtime import resolve
    from tests.hopper import fake_flash_mla

    monkeypatch.setitem(sys.modules, "flash_mla", fake_flash_mla.make())
    monkeypatch.setenv("DSA_FAKE_GPU", "NVIDIA H100 80GB HBM3:9.0")
    pytest.importorskip("triton", reason="needs the triton package (pip install -e '.[test]')")
    manager = manager_with()
    needs = {"k": 2048, "page_size": 64, "decode_queries": 1}
    for heads in (32, 16):
        tp = resolve_kernels(KernelConfig(kv_layout="fp8_656"), manager=manager, needs=needs | {"heads": heads})
        dec = tp.choices["sparse_attn.decode"]
        assert dec.backend == "triton" and f"flashmla_kv would pad (pads heads {heads} -> 64)" in dec.reason, dec.reason
    # A listed cheap padding takes the earlier, padding preference, and says so.
    monkeypatch.setitem(resolve.CHEAP_HEAD_PADDING, ("sparse_attn.decode", "fp8_656"), 2.0)
    tp4 = resolve_kernels(KernelConfig(kv_layout="fp8_656"), manager=manager, needs=needs | {"heads": 32})
    dec = tp4.choices["sparse_attn.decode"]
    assert dec.backend == "flashmla_kv", dec.reason
    assert "padding up to 2x the heads is measured" in dec.reason and dec.reason.endswith("pads heads 32 -> 64")
    tp8 = resolve_kernels(KernelConfig(kv_layout="fp8_656"), manager=manager, needs=needs | {"heads": 16})
    assert tp8.backend_of("sparse_attn.decode") == "triton"  # 4x padding: past the limit
    bf16 = resolve_kernels(KernelConfig(kv_layout="bf16"), manager=manager, needs=needs | {"heads": 32})
    assert bf16.backend_of("sparse_attn.decode") == "triton", bf16.choices["sparse_attn.decode"].reason


def test_auto_orders_the_fp8_decode_by_head_count(monkeypatch):
    # Measured (H200, 2026-11-27, CUDA graphs, 32K, k 2048): at 128 heads tilelang's wsf8c 96.0 us against
    # flashmla_kv's 99.3 at batch 64; at 64 heads flashmla_kv 80.5 against 90.1. The Hopper defaults list tilelang
    # first at 128 heads only, and the choice's reason says why.
    import sys

    from tests.hopper import fake_flash_mla

    monkeypatch.setitem(sys.modules, "flash_mla", fake_flash_mla.make())
    monkeypatch.setenv("DSA_FAKE_GPU", "NVIDIA H100 80GB HBM3:9.0")
    pytest.importorskip("triton", reason="needs the triton package (pip install -e '.[test]')")
    manager = manager_with()
    monkeypatch.setattr(manager.backends["tilelang"], "available", lambda: (True, "tilelang importable (test)"))
    needs = {"k": 2048, "page_size": 64, "decode_queries": 1}

    def decode(heads: int, layout: str = "fp8_656"):
        resolved = resolve_kernels(KernelConfig(kv_layout=layout), manager=manager, needs=needs | {"heads": heads})
        return resolved.choices["sparse_attn.decode"]

    full = decode(128)
    assert full.backend == "tilelang", full.reason
    assert "at 128 heads with fp8_656 KV: tilelang's wsf8c before flashmla_kv" in full.reason
    half = decode(64)
    assert half.backend == "flashmla_kv" and "heads with fp8_656 KV" not in half.reason, half.reason
    bf16 = decode(128, "bf16")  # flashmla_kv claims no bf16 cache; no head-count list for bf16
    assert bf16.backend == "tilelang" and "heads with bf16 KV" not in bf16.reason, bf16.reason
    # Without tilelang the 128-head list falls through to flashmla_kv, still saying which list it followed.
    monkeypatch.setattr(manager.backends["tilelang"], "available", lambda: (False, "no tilelang here"))
    alone = decode(128)
    assert alone.backend == "flashmla_kv" and "at 128 heads with fp8_656 KV" in alone.reason, alone.reason
