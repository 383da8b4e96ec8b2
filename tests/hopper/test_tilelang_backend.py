"""The cuda_hopper ``tilelang`` backend without a GPU: registration, exact claims, availability reasons, ``auto``
order on Hopper, fallback of unclaimed shapes, the decode split bookkeeping (with torch stand-ins for the
kernel and the combine), and, when tilelang is installed, that the program lowers to sm_90a CUDA source."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import types

import pytest
import torch

from dsa_runtime.cli.plugins_cmd import collect
from dsa_runtime.plugin_manager import get_manager
from dsa_runtime.plugins.cuda_hopper.tilelang import sparse_attn as tl_attn
from dsa_runtime.reference.sparse_attn import ReferenceSparseAttn
from dsa_runtime.resolve import KernelConfig, resolve_kernels

H100 = "NVIDIA H100 80GB HBM3:9.0"
V32 = {"heads": 128, "k": 2048, "page_size": 64, "decode_queries": 1}
HAS_TILELANG = importlib.util.find_spec("tilelang") is not None


@pytest.fixture
def with_tilelang(monkeypatch):
    """tilelang importable (a stand-in module when it is not installed) and an SM90 GPU as NVML sees it."""
    if not HAS_TILELANG:
        monkeypatch.setitem(sys.modules, "tilelang", types.ModuleType("tilelang"))
    monkeypatch.setenv("DSA_FAKE_GPU", H100)


@pytest.fixture
def without_tilelang(monkeypatch):
    monkeypatch.delitem(sys.modules, "tilelang", raising=False)
    monkeypatch.setattr(tl_attn.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv("DSA_FAKE_GPU", H100)


def test_registered_with_exact_claims():
    backend = get_manager().get_backend("tilelang")
    assert backend.plugin == backend.platform == "cuda_hopper"
    caps = backend.capabilities
    assert sorted(caps.claimed_methods()) == ["sparse_attn.decode", "sparse_attn.prefill"]
    ok = caps.unclaimed_reason
    for heads, k in ((64, 64), (128, 2048), (128, 16384), (64, 128)):
        assert ok("sparse_attn.prefill", device="cuda", kv_layout="bf16", heads=heads, k=k) is None
        for layout in ("bf16", "fp8_656"):  # the FP8 cache: decode only (wsf8 / ws4f8)
            assert ok("sparse_attn.decode", device="cuda", kv_layout=layout, heads=heads, k=k, page_size=64,
                      decode_queries=2) is None
    assert "KV layout 'fp8_656' not claimed" in ok("sparse_attn.prefill", device="cuda", kv_layout="fp8_656",
                                                   heads=128, k=2048)
    for layout in ("bf16", "fp8_656"):
        for bad in ({"heads": 96}, {"heads": 32}, {"k": 96}, {"k": 32}, {"device": "cpu"}, {"kv_layout": "fp8_e5"}):
            needs = {"device": "cuda", "kv_layout": layout, "heads": 128, "k": 2048} | bad
            assert ok("sparse_attn.prefill", **needs) is not None, bad
            assert ok("sparse_attn.decode", **needs) is not None, bad
    assert isinstance(backend.kernels["sparse_attn"], str)  # imported on first use


def test_unavailable_without_tilelang_with_the_reason_in_plugins(without_tilelang):
    backends = {b["name"]: b for p in collect()["plugins"] for b in p["backends"]}
    assert backends["tilelang"]["available"] is False
    assert "tilelang package is not installed" in backends["tilelang"]["reason"]
    assert "tools/gpu/pack_tilelang.sh" in backends["tilelang"]["reason"]  # the way onto a GPU host without internet


def test_unavailable_without_an_sm90_gpu(with_tilelang, monkeypatch):
    monkeypatch.setenv("DSA_FAKE_GPU", "NVIDIA B200:10.0")
    ok, why = get_manager().get_backend("tilelang").available()
    assert not ok and "no SM90 GPU" in why


def test_available_with_tilelang_on_hopper(with_tilelang):
    ok, why = get_manager().get_backend("tilelang").available()
    assert ok and "tilelang" in why and "SM90 GPU" in why


def test_discovery_imports_neither_tilelang_nor_torch():
    code = (
        "import os, sys\n"
        "os.environ['DSA_FAKE_GPU'] = 'NVIDIA H200:9.0'\n"
        "from dsa_runtime.plugin_manager import get_manager\n"
        "ok, why = get_manager().get_backend('tilelang').available()\n"
        "print('tilelang' in sys.modules, 'torch' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["False", "False"]


def test_auto_order_puts_tilelang_between_flashmla_and_triton():
    from dsa_runtime.plugins.cuda_hopper import defaults, detect

    d = defaults(detect())
    for method, before in (("sparse_attn.prefill", "flashmla_sparse"), ("sparse_attn.decode", "flashmla_kv")):
        order = d.methods[method]
        assert order.index(before) < order.index("tilelang") < order.index("triton"), order


def test_auto_on_hopper_picks_tilelang_without_flashmla(with_tilelang):
    resolved = resolve_kernels(KernelConfig(), needs=V32)  # bf16 KV: flashmla_kv does not claim the decode
    for method in ("sparse_attn.prefill", "sparse_attn.decode"):
        assert resolved.choices[method].backend == "tilelang", resolved.choices[method].reason
    assert type(resolved.sparse_attn.prefill.__self__).__name__ == "TileLangSparseAttn"


def test_fp8_cache_decode_resolves_to_tilelang(with_tilelang):
    resolved = resolve_kernels(KernelConfig(kv_layout="fp8_656"), needs=V32)
    dec = resolved.choices["sparse_attn.decode"]
    assert dec.backend == "tilelang", dec.reason


def test_unclaimed_shapes_fall_back_with_the_reason(with_tilelang):
    resolved = resolve_kernels(KernelConfig(), needs=V32 | {"heads": 130})
    for method in ("sparse_attn.prefill", "sparse_attn.decode"):
        choice = resolved.choices[method]
        assert choice.backend in ("triton", "reference"), choice
        assert "backend 'tilelang'" in choice.reason and "head count 130 not claimed" in choice.reason


def test_narrow_shapes_are_padded_to_the_claims(with_tilelang):
    # Resolution builds the chosen kernels: the triton backend's modules import triton (the test extra has it).
    pytest.importorskip("triton", reason="needs the triton package (pip install -e '.[test]')")
    # auto: triton runs 16 heads as they are, which beats padding them to 64 (4x the work; measured on the H200)
    resolved = resolve_kernels(KernelConfig(), needs=V32 | {"heads": 16, "k": 32})
    pre = resolved.choices["sparse_attn.prefill"]
    assert pre.backend == "triton" and "tilelang would pad (pads heads 16 -> 64, k 32 -> 64)" in pre.reason
    # by name: padded to the claims
    named = resolve_kernels(KernelConfig(sparse_attn="tilelang"), needs=V32 | {"heads": 16, "k": 32})
    pre = named.choices["sparse_attn.prefill"]
    assert pre.backend == "tilelang" and pre.reason.endswith("pads heads 16 -> 64, k 32 -> 64")


def test_plan_splits():
    assert tl_attn.plan_splits(4096, 128, 2048) == 1  # prefill-sized batches fill the GPU
    assert tl_attn.plan_splits(64, 128, 2048) == 1  # 128 blocks: one wave of 132 SMs already
    assert tl_attn.plan_splits(1, 128, 2048) == 16  # 2 blocks -> 32 (chunks of 128)
    assert tl_attn.plan_splits(8, 64, 2048) == 16  # 8 blocks -> 128
    assert tl_attn.plan_splits(1, 64, 64) == 1  # k 64: a single chunk
    for rows, heads, k in ((1, 64, 2048), (3, 128, 512), (16, 64, 4096)):
        n = tl_attn.plan_splits(rows, heads, k)
        assert k % (n * 64) == 0 and k // n >= min(k, 128)


def _torch_run(self, q, kv, idx, sm_scale, split, decode=False):
    """Stand-in for the compiled kernel: the reference in fp32, with the kernel's split-mode conventions (the
    ``fp8_656`` rows, which reach it as ``[S, 656]`` e4m3, dequantised to bf16 as the kernel's gather does; split
    index row ``t`` over q row ``t % R``, q read in place)."""
    if idx.shape[0] != q.shape[0]:
        assert split and idx.shape[0] % q.shape[0] == 0
        q = q.repeat(idx.shape[0] // q.shape[0], 1, 1)
    if kv.dtype == torch.float8_e4m3fn:
        from dsa_runtime.reference.kv_quant import unpack_mla_fp32

        assert decode and kv.shape[-1] == 656
        kv = unpack_mla_fp32(kv.view(torch.uint8), "fp8_656").bfloat16()
    out, lse = ReferenceSparseAttn().prefill(q, kv, idx, sm_scale)
    if split:
        return out.float(), torch.where(torch.isposinf(lse), float("-inf"), lse)
    return out, lse


def _torch_combine(part, part_lse, pdl=False):
    m = part_lse.max(dim=0).values
    empty = torch.isneginf(m)
    w = torch.exp(part_lse - torch.where(empty, 0.0, m))
    out = (w[..., None] * part).sum(0) / torch.where(empty, 1.0, w.sum(0))[..., None]
    lse = torch.where(empty, float("inf"), torch.where(empty, 0.0, m) + torch.log(torch.where(empty, 1.0, w.sum(0))))
    return out.bfloat16(), lse


@pytest.mark.parametrize("splits", [1, 2, 4])
def test_decode_split_bookkeeping_equals_the_reference(monkeypatch, splits):
    """The flat view, the (split, row) layout of the split rows and their merge equal the reference decode."""
    import dsa_runtime.plugins.cuda_hopper.triton as triton_pkg

    combine_mod = types.ModuleType("sparse_mla_combine")
    combine_mod.combine_splits = _torch_combine
    monkeypatch.setitem(sys.modules, f"{triton_pkg.__name__}.sparse_mla_combine", combine_mod)
    monkeypatch.setattr(tl_attn.TileLangSparseAttn, "_run", _torch_run)
    gen = torch.Generator().manual_seed(11)
    b, n_q, heads, pages, k = 3, 2, 64, 6, 256
    cache = torch.randn(pages, 64, 576, generator=gen).bfloat16()
    q = torch.randn(b, n_q, heads, 576, generator=gen).bfloat16()
    idx = torch.stack([torch.randperm(pages * 64, generator=gen)[:k] for _ in range(b * n_q)]).view(b, n_q, k)
    idx = idx.to(torch.int32)
    idx[0, 0] = -1  # an empty query
    idx[1, 1, : k // 2] = -1  # the first half empty: whole splits see nothing
    idx[2, 0, ::3] = -1
    out, lse = tl_attn.TileLangSparseAttn(decode_splits=splits).decode(q, cache, idx, 0.135234, layout="bf16")
    want_out, want_lse = ReferenceSparseAttn().decode(q, cache, idx, 0.135234, layout="bf16")
    assert out.shape == (b, n_q, heads, 512) and lse.shape == (b, n_q, heads)
    torch.testing.assert_close(out.float(), want_out.float(), rtol=0.02, atol=0.02)
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-4)
    assert torch.isposinf(lse[0, 0]).all() and (out[0, 0] == 0).all()


@pytest.mark.parametrize(("splits", "heads"), [(1, 64), (2, 64), (1, 128)])
def test_fp8_decode_routes_the_e4m3_rows_to_the_fp8_kernel(monkeypatch, splits, heads):
    """layout="fp8_656": the flat [S, 656] rows reach the kernel as e4m3 with the FP8 launch shape (the paired
    wsf8c for 128 heads, wsf8h for one 64-head block), and the result (stand-in kernel) equals the reference
    fp8_656 decode; unselected rows are NaN garbage."""
    import dsa_runtime.plugins.cuda_hopper.triton as triton_pkg
    from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla import FP8_DECODE_CONFIG, FP8_DECODE_CONFIG_64
    from dsa_runtime.testing.fp8util import pack_mla_656, random_bytes

    combine_mod = types.ModuleType("sparse_mla_combine")
    combine_mod.combine_splits = _torch_combine
    monkeypatch.setitem(sys.modules, f"{triton_pkg.__name__}.sparse_mla_combine", combine_mod)
    seen = []

    def run(self, q, kv, idx, sm_scale, split, decode=False):
        seen.append((kv.dtype, tuple(kv.shape),
                     self._config(idx.shape[-1], decode, kv.dtype == torch.float8_e4m3fn, q.shape[1])))
        return _torch_run(self, q, kv, idx, sm_scale, split, decode)

    monkeypatch.setattr(tl_attn.TileLangSparseAttn, "_run", run)
    gen = torch.Generator().manual_seed(5)
    b, n_q, pages, k = 2, 2, 5, 128
    idx = torch.stack([torch.randperm(pages * 64 - 64, generator=gen)[:k] + 64 for _ in range(b * n_q)])
    idx = idx.to(torch.int32).view(b, n_q, k)
    idx[0, 1] = -1  # an empty query
    idx[1, 0, ::5] = -1
    used = torch.unique(idx[idx >= 0].long())
    cache = random_bytes(gen, (pages * 64, 656), torch.device("cpu"))
    cache[:, 0:512:61] = 0x7F  # e4m3 NaN in the rows nobody selects (page 0 among them)
    cache[used] = pack_mla_656(torch.randn(used.numel(), 512, generator=gen),
                               torch.randn(used.numel(), 64, generator=gen), "ue8m0")
    cache = cache.view(pages, 64, 656)
    q = torch.randn(b, n_q, heads, 576, generator=gen).bfloat16()
    out, lse = tl_attn.TileLangSparseAttn(decode_splits=splits).decode(q, cache, idx, 0.135234, layout="fp8_656")
    want_out, want_lse = ReferenceSparseAttn().decode(q, cache, idx, 0.135234, layout="fp8_656")
    want_cfg = FP8_DECODE_CONFIG if heads == 128 else FP8_DECODE_CONFIG_64
    assert seen == [(torch.float8_e4m3fn, (pages * 64, 656), want_cfg)]
    assert want_cfg.variant == ("wsf8c" if heads == 128 else "wsf8h")
    torch.testing.assert_close(out.float(), want_out.float(), rtol=0.02, atol=0.02)
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-4)
    assert torch.isposinf(lse[0, 1]).all() and (out[0, 1] == 0).all()


def test_fp8_and_bf16_launch_shapes_are_chosen_apart(monkeypatch):
    """An FP8 candidate (by argument or $DSA_TILELANG_SPARSE_MLA) replaces only the fp8_656 decode kernel, a bf16
    one only the bf16 kernels: neither runs a cache layout it does not read."""
    from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla import (
        CANDIDATES,
        DECODE_CONFIG,
        DEFAULT_CONFIG,
        FP8_DECODE_CONFIG,
        FP8_VARIANTS,
    )

    monkeypatch.delenv(tl_attn.CONFIG_ENV, raising=False)
    assert FP8_DECODE_CONFIG.variant in FP8_VARIANTS and DECODE_CONFIG.variant not in FP8_VARIANTS
    fp8 = [c for c in CANDIDATES if c.variant in FP8_VARIANTS]
    assert {c.variant for c in fp8} == {"wsf8", "ws4f8", "wsf8h", "wsf8c"}
    kern = tl_attn.TileLangSparseAttn()
    assert kern._config(2048, decode=True, fp8=True) == FP8_DECODE_CONFIG
    assert kern._config(2048, decode=True, fp8=True, heads=64).variant == "wsf8h"  # wsf8c pairs 2 x 64 heads
    assert kern._config(2048, decode=True) == DECODE_CONFIG and kern._config(2048) == DEFAULT_CONFIG
    for cfg in fp8:
        monkeypatch.setenv(tl_attn.CONFIG_ENV, cfg.label())
        kern = tl_attn.TileLangSparseAttn()
        assert kern._config(2048, decode=True, fp8=True) == cfg
        assert kern._config(2048, decode=True, fp8=True, heads=64).variant == (
            "wsf8h" if cfg.variant == "wsf8c" else cfg.variant)
        assert kern._config(2048, decode=True) == DECODE_CONFIG and kern._config(2048) == DEFAULT_CONFIG
    ws = next(c for c in CANDIDATES if c.variant == "ws")
    kern = tl_attn.TileLangSparseAttn(config=ws)
    assert kern._config(2048) == kern._config(2048, decode=True) == ws
    assert kern._config(2048, decode=True, fp8=True) == FP8_DECODE_CONFIG


def test_bad_inputs_are_one_line_errors():
    kern = tl_attn.TileLangSparseAttn()
    q = torch.zeros(2, 64, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="d_v 512"):
        kern.prefill(q, torch.zeros(4, 576, dtype=torch.bfloat16), torch.zeros(2, 64, dtype=torch.int32), 0.1, d_v=256)
    with pytest.raises(ValueError, match="bf16 q and bf16 or fp8_656 kv"):
        kern.prefill(q.float(), torch.zeros(4, 576), torch.zeros(2, 64, dtype=torch.int32), 0.1)
    with pytest.raises(ValueError, match="unknown MLA layout 'fp8_e5'; valid: bf16, fp8_656"):
        kern.decode(q[None], torch.zeros(1, 64, 656, dtype=torch.uint8), torch.zeros(1, 2, 64, dtype=torch.int32),
                    0.1, layout="fp8_e5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"fp8_656 cache must be \[pages, page_size, 656\] torch.uint8"):
        kern.decode(q[None], torch.zeros(1, 64, 576, dtype=torch.bfloat16), torch.zeros(1, 2, 64, dtype=torch.int32),
                    0.1, layout="fp8_656")
    with pytest.raises(ValueError, match=r"bf16 cache must be \[pages, page_size, 576\] torch.bfloat16"):
        kern.decode(q[None], torch.zeros(1, 64, 656, dtype=torch.uint8), torch.zeros(1, 2, 64, dtype=torch.int32),
                    0.1, layout="bf16")
    with pytest.raises(ValueError, match="fp8_656 cache in decode only"):
        kern.prefill(q, torch.zeros(4, 656, dtype=torch.float8_e4m3fn), torch.zeros(2, 64, dtype=torch.int32), 0.1)


NO_TILELANG = pytest.mark.skipif(not HAS_TILELANG, reason="tilelang is not installed (CI does not install it; "
                                 "pip install 'dsa-runtime[hopper]' to run this lowering check)")


@NO_TILELANG
@pytest.mark.parametrize(("variant", "split"), [("pipe", False), ("ws", True), ("wsa", False), ("ws4", True),
                                               ("wsf8", True), ("ws4f8", False), ("wsf8h", False),
                                               ("wsf8c", True), ("wsf8c", False)])
def test_program_lowers_to_sm90a_cuda_source(variant, split):
    from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla import (
        CANDIDATES,
        FP8_VARIANTS,
        cuda_source,
        source_problems,
    )

    cfg = next(c for c in CANDIDATES if c.variant == variant)
    heads = 128 if variant == "wsf8c" else 64  # wsf8c pairs the two 64-head blocks of 128 heads
    src, smem = cuda_source(heads, 192, 0.135234, cfg, split)  # 3 chunks: the ws ring's odd tail
    assert "__global__" in src and ("sparse_mla_pipe" if variant == "pipe" else "sparse_mla_ws") in src
    assert ("wait_wgmma<1>" in src) == (variant == "wsa")  # only wsa overlaps the softmax with its P . V
    assert source_problems(src) == []
    assert ("float* __restrict__ Out" in src) == split  # split partials are fp32
    assert 0 < smem <= 227 * 1024  # fits an H100's shared memory per block
    fp8 = variant in FP8_VARIANTS
    assert ("const fp8_e4_t* __restrict__" in src) == fp8  # the fp8_656 rows, read as e4m3 (decode only)
    assert ("cp_async_gs_conditional" in src) != fp8  # the FP8 gather loads into registers instead
    assert ("half_t* __restrict__" in src or "wgmma_ss<tl::DataType::kFloat16" in src) == (variant in ("wsf8h", "wsf8c"))
    if fp8:  # a load outside the index check is caught
        unguarded = src.replace("if ((0 <= row) && (row < n_kv)) {", "if ((0 <= row)) {")
        assert any("outside the index check" in p for p in source_problems(unguarded))
    if variant == "wsf8c":  # a source storing into the peer without the cluster sync after the barriers' init
        assert "dsa_cvt8_both((" in src and "dsa_rope8_both((" in src and "cluster_sync" in src
        assert "dsa_push" not in src and "cp.async.bulk.shared::cluster" not in src  # no bulk push any more
        unsynced = src.replace("tl::cluster_sync();", "")
        assert any("no cluster sync" in p for p in source_problems(unsynced))
        # the gather issues a row's loads before it waits for a free stage (fp8_half_gather_macros), with the
        # chunk's row index read a chunk before (no Idx read between the loop's top and its first load) and the
        # next chunk's rows prefetched into L2 before the wait (dsa_ld_nc8 / nc16: the read-only, evict_last,
        # 256-byte-L2 loads FlashMLA's gather uses); it converts and stores only after the wait
        cache = re.search(r"const fp8_e4_t\* __restrict__ (\w+)", src).group(1)
        lat8 = r"dsa_ld_nc8\(\(&\(lat8\[\(\(i_\d+ \* 64\) \+ \(a \* 8\)\)\]\)\), "
        load = re.search(lat8 + rf"\(&\({cache}\[", src).group(0)
        gather = src[src.index("warpgroup_reg_dealloc<96>"):]
        assert gather.index(load) < gather.index("free[st_") < gather.index("dsa_cvt8_both((")
        loop = gather[gather.index("for (int r_"):]
        assert loop.index(load) < loop.index("Idx[")
        assert loop.index(load) < loop.index("dsa_prefetch_row_l2(") < loop.index("free[st_")
        # not split, the bf16 outputs leave through the dead Q buffer by TMA; split partials are fp32 stores
        assert ("tma_store(" in src) == (not split)
        # Q (.q_f16, not split): every load of a thread issued before its first converted store, then a fence and
        # a barrier
        assert ("dsa_store_f16x8((" in src) == (not split)  # the call (the prelude defines it)
        if not split:
            q_part = src[src.index("warpgroup_reg_alloc<240>"):src.index("warpgroup_reg_dealloc<96>")]
            q_part = q_part[:q_part.index("for (int r")]
            assert q_part.rindex("(Q + ") < q_part.index("dsa_store_f16x8((") < q_part.index("_partial(8, 128)")


def test_bad_launch_shapes_are_refused():
    from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla import TLConfig, check_shape

    with pytest.raises(ValueError, match="pairs the two 64-head blocks"):
        check_shape(64, 128, TLConfig(threads=384, variant="wsf8c"))

    with pytest.raises(ValueError, match="multiples of 64"):
        check_shape(96, 128, TLConfig())
    with pytest.raises(ValueError, match="multiple of block_i"):
        check_shape(64, 96, TLConfig())
    with pytest.raises(ValueError, match="384 threads"):
        check_shape(64, 128, TLConfig(variant="ws"))
    with pytest.raises(ValueError, match="ws4 schedule runs 512 threads"):
        check_shape(64, 128, TLConfig(threads=384, variant="ws4"))
    with pytest.raises(ValueError, match="unknown"):
        check_shape(64, 128, TLConfig(variant="fast"))


def test_gpu_bench_script_plumbing_runs_on_cpu(tmp_path):
    """bench/sparse_attn_tilelang.py --dry-run: the lead's GPU script end to end at tiny sizes, the reference
    standing in for the kernel (a typo there would otherwise cost a GPU run). Every candidate runs in this one
    process (--no-isolate: the same rows in a quarter of the time); the next test runs candidates in children."""
    import json
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "bench" / "sparse_attn_tilelang.py"
    out = tmp_path / "dry.json"
    run = subprocess.run([sys.executable, str(script), "--dry-run", "--no-isolate", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["checks_ok"] is True and "FAIL" not in run.stdout
    labels = {r["label"] for r in result["rows"]}
    assert any(lbl.startswith("tilelang ws_") for lbl in labels) and any("splits" in lbl for lbl in labels)
    fp8_rows = [r for r in result["rows"] if r["shape"].startswith("decode fp8")]
    assert {r["label"].split()[1] for r in fp8_rows} == {"wsf8_i64_s2_t384", "ws4f8_i64_s2_t512",
                                                          "wsf8h_i64_s2_t384", "wsf8c_i64_s2_t384"}
    assert "PASS decode fp8_656 wsf8_i64_s2_t384" in run.stdout and "PASS decode fp8_656 ws4f8" in run.stdout
    # the FP8 candidates run no prefill nor bf16 decode, and a bf16 candidate no fp8_656 decode
    assert all(r["shape"].startswith("decode fp8") for r in result["rows"] if "f8_i64" in r["label"])


def test_gpu_bench_survives_a_dying_candidate(tmp_path):
    """A warp-specialised candidate whose process dies (as on a sticky illegal instruction) is a FAIL with its
    exit code; the pipe results and the other children's are still measured and written."""
    import json
    import os
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "bench" / "sparse_attn_tilelang.py"
    out = tmp_path / "dry.json"
    env = os.environ | {"DSA_TILELANG_DRY_FAULT": "ws_i64_s2_t384"}
    run = subprocess.run([sys.executable, str(script), "--dry-run", "--out", str(out), "--only", "pipe_i64_s2,ws_,ws4",
                          "--skip", "wsa"], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["checks"]["ws_i64_s2_t384"] is False and result["children"]["ws_i64_s2_t384"]["rc"] == 134
    assert result["checks"]["pipe_i64_s2_t256"] is True and result["checks"]["ws4_i64_s2_t512"] is True
    labels = {r["label"] for r in result["rows"]}
    assert "tilelang ws4_i64_s2_t512" in labels and "tilelang pipe_i64_s2_t256" in labels
    assert not any("wsa" in lbl or "pipe_i32" in lbl for lbl in labels)
    assert not any(lbl.startswith("tilelang ws_") for lbl in labels)


def test_launch_shape_from_the_environment(monkeypatch):
    from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla import CANDIDATES, DEFAULT_CONFIG

    monkeypatch.delenv(tl_attn.CONFIG_ENV, raising=False)
    assert tl_attn.TileLangSparseAttn()._config(2048) == DEFAULT_CONFIG
    ws = next(c for c in CANDIDATES if c.variant == "ws")
    monkeypatch.setenv(tl_attn.CONFIG_ENV, ws.label())
    assert tl_attn.TileLangSparseAttn()._config(2048) == ws
    narrow = next(c for c in CANDIDATES if c.block_i == 32)
    assert tl_attn.TileLangSparseAttn(config=narrow)._config(64) == narrow  # 64 % 32 == 0: kept
    monkeypatch.setenv(tl_attn.CONFIG_ENV, "fastest")
    with pytest.raises(ValueError, match="names no candidate; valid: pipe_i64_s2_t256"):
        tl_attn.TileLangSparseAttn()


def test_kit_passes_the_wrapper_on_cpu_with_a_standin_kernel():
    """The conformance kit through the real claims, core padding, flat decode view and split merge, with
    PyTorch standing in for the compiled kernel (tests/hopper/tilelang_standin.py); the GPU run certifies it."""
    from dsa_runtime.testing import run_conformance

    report = run_conformance("tests.hopper.tilelang_standin:backend", families=["sparse_attn"], device="cpu",
                             progress=False)
    bad = [f"{c.id}: {c.status}: {c.message[:300]}" for c in report.cases if c.status in ("failed", "error")]
    assert not bad, "\n".join(bad)
    passed = [c.id for c in report.cases if c.status == "passed"]
    assert any("/prefill/" in i for i in passed) and any("/decode/bf16/" in i for i in passed)
    assert any("/decode/fp8_656/" in i for i in passed)  # the FP8 cache: decode claimed (wsf8)
