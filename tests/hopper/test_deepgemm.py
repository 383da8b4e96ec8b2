"""The ``deepgemm`` backend on CPU: registration, availability, API generations, and the claimed kit cases
through a plain-torch fake ``deep_gemm`` (tests/hopper/fake_deep_gemm.py), which checks our layout translation."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

import dsa_runtime.plugins.cuda_hopper.deepgemm as dg
from dsa_runtime.backend import Backend
from dsa_runtime.capabilities import Capabilities
from dsa_runtime.families import ExpertWeights
from dsa_runtime.plugin_manager import get_manager
from dsa_runtime.plugins.cuda_hopper.deepgemm_api import DeepGEMMAPI, detect_generation, load_api
from dsa_runtime.plugins.cuda_hopper.deepgemm_indexer import DeepGEMMIndexer
from dsa_runtime.plugins.cuda_hopper.deepgemm_moe import DeepGEMMMoE
from dsa_runtime.reference.moe import ReferenceMoE
from dsa_runtime.reference.plugin import reference_backend
from dsa_runtime.resolve import KernelConfig, resolve_kernels
from dsa_runtime.testing.registry import family_cases
from dsa_runtime.testing.runner import RunContext, run_case
from tests.hopper.fake_deep_gemm import make_module

GENERATIONS = ("fp8", "fp8_fp4")


class Counting:
    """Counts calls of the wrapped fake module's functions (proves the DeepGEMM path ran)."""

    def __init__(self, module):
        self.module, self.calls = module, {}

    def __getattr__(self, name):
        fn = getattr(self.module, name)

        def wrapped(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return fn(*args, **kwargs)

        return wrapped if callable(fn) else fn


def _api(generation):
    module = Counting(make_module(generation))
    return DeepGEMMAPI(module, detect_generation(module.module)), module


@pytest.fixture
def fake_deepgemm(monkeypatch):
    """``deep_gemm`` importable (the 2026 generation) and an H100 visible."""
    monkeypatch.setitem(sys.modules, "deep_gemm", make_module("fp8_fp4"))
    monkeypatch.setattr(dg, "module_available", lambda name: name == "deep_gemm")
    monkeypatch.setenv("DSA_FAKE_GPU", "NVIDIA H100 80GB HBM3:9.0")
    load_api.cache_clear()
    yield
    load_api.cache_clear()


def test_registered_with_exactly_the_sm90_claims():
    backend = get_manager().get_backend("deepgemm")
    assert backend.plugin == "cuda_hopper" and backend.platform == "cuda_hopper"
    caps = backend.capabilities
    assert caps.claimed_methods() == ["indexer.logits_ragged", "indexer.logits_paged", "moe.experts"]
    assert all(isinstance(f, str) and ":" in f for f in backend.kernels.values())
    assert caps.devices == frozenset({"cuda"})
    ok = {"device": "cuda"}
    assert caps.unclaimed_reason("indexer.logits_ragged", index_heads=64, **ok) is None
    assert caps.unclaimed_reason("indexer.logits_ragged", index_heads=32, **ok) is None
    assert "indexer head count 16" in caps.unclaimed_reason("indexer.logits_ragged", index_heads=16, **ok)
    assert caps.unclaimed_reason("indexer.logits_paged", index_heads=64, page_size=64, decode_queries=2, **ok) is None
    assert caps.unclaimed_reason("indexer.logits_paged", index_heads=64, page_size=16, **ok) is not None
    assert caps.unclaimed_reason("indexer.logits_paged", index_heads=64, decode_queries=3, **ok) is not None
    assert caps.unclaimed_reason("moe.experts", weight_dtype="fp8_e4m3", **ok) is None
    assert caps.unclaimed_reason("moe.experts", weight_dtype="bf16", **ok) is not None
    for method in ("indexer.quantize_q", "indexer.quantize_k", "moe.route"):
        assert "not a DeepGEMM kernel" in caps.unclaimed_reason(method, **ok)
    assert caps.unclaimed_reason("indexer.logits_ragged", index_heads=64, device="cpu") is not None


def test_absent_without_deep_gemm_with_a_reason_in_plugins(monkeypatch):
    monkeypatch.setenv("DSA_FAKE_GPU", "NVIDIA H100 80GB HBM3:9.0")
    monkeypatch.setattr(dg, "module_available", lambda name: False)
    ok, why = dg.deepgemm_available()
    assert not ok and "deep_gemm is not installed" in why
    code = "import sys; from dsa_runtime.cli.main import main; sys.exit(main(['plugins']))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    line = next(ln for ln in run.stdout.splitlines() if "backend deepgemm" in ln)
    assert "unavailable: deep_gemm is not installed" in line


def test_availability_imports_neither_torch_nor_deep_gemm():
    code = (
        "import sys; from dsa_runtime.plugin_manager import get_manager\n"
        "print(get_manager().get_backend('deepgemm').available()[0], 'torch' in sys.modules, 'deep_gemm' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["False", "False", "False"]


def test_available_only_on_sm90(fake_deepgemm, monkeypatch):
    ok, why = dg.deepgemm_available()
    assert ok and "SM90" in why
    monkeypatch.setenv("DSA_FAKE_GPU", "NVIDIA B200:10.0")
    from dsa_runtime.hw_probe import probe_nvidia

    probe_nvidia.cache_clear()
    ok, why = dg.deepgemm_available()
    assert not ok and "no SM90 GPU" in why


def test_auto_mixes_methods_per_backend(fake_deepgemm):
    resolved = resolve_kernels(KernelConfig(), needs={"index_heads": 64, "decode_queries": 2})
    assert resolved.backend_of("indexer.logits_ragged") == "deepgemm"
    # paged decode logits prefer our Triton kernel (measured ahead of DeepGEMM's), when triton is installed
    has_triton = importlib.util.find_spec("triton") is not None
    assert resolved.backend_of("indexer.logits_paged") == ("triton" if has_triton else "deepgemm")
    assert resolved.backend_of("moe.experts") == "deepgemm"
    # quantize_q/k and route are no DeepGEMM kernels: the next backend that can run them takes them.
    for method in ("indexer.quantize_q", "indexer.quantize_k", "moe.route"):
        assert resolved.backend_of(method) in ("triton", "reference")
    assert type(resolved.indexer.logits_ragged.__self__).__name__ == "DeepGEMMIndexer"
    # 16 index heads are outside DeepGEMM's SM90 kernels: not chosen.
    small = resolve_kernels(KernelConfig(), needs={"index_heads": 16})
    assert small.backend_of("indexer.logits_ragged") != "deepgemm"


def test_generation_detection():
    assert detect_generation(make_module("fp8")) == "fp8"
    assert detect_generation(make_module("fp8_fp4")) == "fp8_fp4"
    import types

    with pytest.raises(ImportError, match="neither fp8_fp4_mqa_logits nor fp8_mqa_logits"):
        detect_generation(types.ModuleType("deep_gemm"))


def test_load_api_uses_the_installed_module(fake_deepgemm):
    api = load_api()
    assert api.generation == "fp8_fp4" and api.two_d_lens


def _run_claimed(backend: Backend, family: str) -> list[str]:
    cpu = torch.device("cpu")
    ctx = RunContext(backend, reference_backend(), cpu, cpu)
    ran, bad = [], []
    for case in family_cases(family):
        if case.tier != "quick" or ctx.unclaimed_reason(case) is not None:
            continue
        res = run_case(case, ctx)
        ran.append(case.id)
        if res.status != "passed":
            bad.append(f"{case.id}: {res.status} {res.message[:300]}")
    assert not bad, "\n".join(bad)
    return ran


def _cpu_backend(kernels) -> Backend:
    methods = {m: c for m, c in dg.DEEPGEMM_CLAIMS.items() if m.split(".")[0] in kernels}
    caps = Capabilities(devices=frozenset({"cpu"}), methods=methods, not_claimed=dg.DEEPGEMM_NOT_CLAIMED)
    return Backend("deepgemm_fake", caps, kernels)


@pytest.mark.parametrize("generation", GENERATIONS)
def test_indexer_quick_cases_through_the_fake(generation):
    api, module = _api(generation)
    ran = _run_claimed(_cpu_backend({"indexer": lambda: DeepGEMMIndexer(api)}), "indexer")
    assert any("/logits_ragged/h32/" in c for c in ran) and any("/logits_ragged/h64/" in c for c in ran)
    assert sum("/logits_paged/" in c for c in ran) >= 3 and any("/q2/" in c for c in ran)
    assert not any("/quantize_" in c or "/h16/" in c or "/p16/" in c for c in ran)
    prefix = "fp8_fp4_" if generation == "fp8_fp4" else "fp8_"
    assert module.calls[prefix + "mqa_logits"] >= 4 and module.calls[prefix + "paged_mqa_logits"] >= 3


@pytest.mark.parametrize("generation,masked_max", [("fp8", 64), ("fp8_fp4", 64), ("fp8_fp4", 0)])
def test_moe_quick_cases_through_the_fake(generation, masked_max):
    api, module = _api(generation)
    kern = lambda: DeepGEMMMoE(masked_max_tokens=masked_max, api=api)  # noqa: E731
    ran = _run_claimed(_cpu_backend({"moe": kern}), "moe")
    assert ran and all("/fp8/" in c for c in ran) and not any("/route/" in c for c in ran)
    calls = sum(n for name, n in module.calls.items() if "m_grouped" in name)
    assert calls >= 2  # the 128-aligned case (d256/i128) ran through the grouped GEMMs


@pytest.mark.parametrize("masked_max", [64, 0])
@pytest.mark.parametrize("fmt", ["ue8m0", "float"])
def test_moe_matches_reference_with_duplicates_and_bad_ids(masked_max, fmt, monkeypatch):
    import dsa_runtime.plugins.cuda_hopper.deepgemm_moe as moe_mod

    monkeypatch.setattr(moe_mod, "ROW_CHUNK", 100)  # several SwiGLU/combine chunks, boundaries off the alignment
    gen = torch.Generator().manual_seed(7)
    n_exp, dim, inter, tokens = 5, 256, 128, 6
    w13 = (torch.randn(n_exp, 2 * inter, dim, generator=gen) * 8).to(torch.float8_e4m3fn)
    w2 = (torch.randn(n_exp, dim, inter, generator=gen) * 8).to(torch.float8_e4m3fn)
    s13 = torch.rand(n_exp, 2, 2, generator=gen) * 0.01 + 0.001
    s2 = torch.rand(n_exp, 2, 1, generator=gen) * 0.01 + 0.001
    ew = ExpertWeights(w13, w2, s13, s2)
    x = torch.randn(tokens, dim, generator=gen).bfloat16()
    ids = torch.tensor([[0, 0], [1, -1], [4, 2], [-1, -1], [3, 3], [2, 1]], dtype=torch.int32)  # duplicates
    w = torch.rand(tokens, 2, generator=gen) + 0.2
    api, _ = _api("fp8_fp4")
    got = DeepGEMMMoE(fmt, masked_max_tokens=masked_max, api=api).experts(x, w, ids, ew)
    want = ReferenceMoE().experts(x, w, ids, ew)
    err = (got.float() - want.float()).norm(dim=1) / want.float().norm(dim=1).clamp_min(1e-6)
    assert float(err[want.float().norm(dim=1) > 0].max()) < 0.12  # the kit's moe.out_fp8 bound and bool((got[3] == 0).all())
    with pytest.raises(ValueError, match=r"expert ids must be -1 or in \[0, 5\)"):
        DeepGEMMMoE(fmt, masked_max_tokens=masked_max, api=api).experts(x, w, ids.clamp(max=4) + (ids == 4) * 3, ew)


@pytest.mark.parametrize("generation", GENERATIONS)
def test_paged_clips_lengths_to_the_output_and_masks_short_requests(generation):
    """A request shorter than its MTP queries (limit < 1 for query 0) and an output narrower than a request:
    the kernel sees lengths within [0, max_context_len], the result still equals the reference's."""
    from dsa_runtime.reference.indexer import ReferenceIndexer
    from dsa_runtime.testing.fp8util import random_e4m3

    gen = torch.Generator().manual_seed(3)
    pages, n_q, heads = 6, 2, 32
    k8 = random_e4m3(gen, (pages * 64, 128), torch.device("cpu"))
    scale = torch.exp2(torch.rand(pages * 64, generator=gen) * 6 - 10)
    cache = torch.cat([k8.view(torch.uint8).reshape(pages, -1), scale.view(torch.uint8).reshape(pages, -1)], dim=1)
    table = torch.tensor([[2, 0, 5], [1, 3, 4]], dtype=torch.int32)
    lens = torch.tensor([150, 1], dtype=torch.int32)
    q8 = random_e4m3(gen, (2, n_q, heads, 128), torch.device("cpu"))
    w = torch.randn(2 * n_q, heads, generator=gen) * 1e-4
    api, _ = _api(generation)
    for max_len in (160, 100):
        got = DeepGEMMIndexer(api).logits_paged(q8, w, cache, lens, table, max_len)
        want = ReferenceIndexer().logits_paged(q8, w, cache, lens, table, max_len)
        assert torch.equal(torch.isinf(got), torch.isinf(want)) and not bool(torch.isnan(got).any())
        fin = torch.isfinite(want)
        assert float((got[fin] - want[fin]).abs().max()) <= 1e-5 * float(want[fin].abs().max())  # sum order
        # Request 1 holds one token for two queries: query 0 sees nothing, query 1 only position 0.
        assert bool(torch.isinf(got[2]).all()) and bool(torch.isfinite(got[3, 0])) and bool(torch.isinf(got[3, 1:]).all())


def _misaligned_e4m3(gen, shape):
    """A contiguous e4m3 tensor whose base is 1 byte past a 16-byte boundary (a view into a larger buffer)."""
    from dsa_runtime.testing.fp8util import random_e4m3

    n = 1
    for s in shape:
        n *= s
    flat = random_e4m3(gen, (n + 16,), torch.device("cpu"))
    off = (1 - flat.data_ptr()) % 16 or 16
    view = flat[off : off + n].view(shape)
    assert view.is_contiguous() and view.data_ptr() % 16 == 1
    return view


def _ragged_inputs(gen, t=6, s=40, heads=32):
    from dsa_runtime.testing.fp8util import random_e4m3

    q8 = random_e4m3(gen, (t, heads, 128), torch.device("cpu"))
    k8 = random_e4m3(gen, (s, 128), torch.device("cpu"))
    k_scale = torch.exp2(torch.rand(s, generator=gen) * 6 - 10)
    w = torch.randn(t, heads, generator=gen) * 1e-3
    ks = torch.tensor([0, 3, 10, 5, 0, 30][:t], dtype=torch.int32)
    ke = torch.tensor([4, 20, 10, 2, 40, 40][:t], dtype=torch.int32)  # row 2 empty, row 3 ke < ks
    return q8, w, k8, k_scale, ks, ke


def test_fake_refuses_the_layouts_deepgemm_trusts():
    """The fake fails where the real library would crash or misread: so the CPU tests check our layouts."""
    gen = torch.Generator().manual_seed(11)
    m = make_module("fp8_fp4")
    q8, w, k8, k_scale, ks, ke = _ragged_inputs(gen)
    ke = torch.maximum(ke, ks)
    m.fp8_fp4_mqa_logits((q8, None), (k8, k_scale), w, ks, ke)  # the well-formed call passes
    with pytest.raises(AssertionError, match="16-byte"):
        m.fp8_fp4_mqa_logits((_misaligned_e4m3(gen, tuple(q8.shape)), None), (k8, k_scale), w, ks, ke)
    with pytest.raises(AssertionError, match=r"fp32 \[S\]"):
        m.fp8_fp4_mqa_logits((q8, None), (k8, k_scale[:, None]), w, ks, ke)
    with pytest.raises(AssertionError, match="weights"):
        m.fp8_fp4_mqa_logits((q8, None), (k8, k_scale), w.t().contiguous().t(), ks, ke)
    with pytest.raises(AssertionError, match="cu_seq_len_k_start"):
        m.fp8_fp4_mqa_logits((q8, None), (k8, k_scale), w, ks.long(), ke)
    # Paged: metadata made for other lengths, 1-D lengths with the 2-D API.
    cache = torch.zeros(2, 64, 1, 132, dtype=torch.uint8)
    q = q8[:2].view(1, 2, 32, 128)
    lens = torch.tensor([[30, 31]], dtype=torch.int32)
    table = torch.tensor([[0, 1]], dtype=torch.int32)
    meta = m.get_paged_mqa_logits_metadata(lens, 64, m.get_num_sms())
    m.fp8_fp4_paged_mqa_logits((q, None), cache, w[:2], lens, table, meta, 64)
    with pytest.raises(AssertionError, match="not made for these lengths"):
        m.fp8_fp4_paged_mqa_logits((q, None), cache, w[:2], lens + 1, table, meta, 64)
    with pytest.raises(AssertionError, match="context_lens"):
        m.fp8_fp4_paged_mqa_logits((q, None), cache, w[:2], lens[:, 1], table, meta, 64)
    # Grouped GEMMs: a 128-row block mixing experts; int64 masked_m.
    a8 = torch.zeros(256, 128, dtype=torch.float8_e4m3fn)
    b8 = torch.zeros(2, 128, 128, dtype=torch.float8_e4m3fn)
    a_s, b_s = torch.ones(256, 1), torch.ones(2, 1, 1)
    d = torch.empty(256, 128, dtype=torch.bfloat16)
    m_idx = torch.tensor([0] * 100 + [-1] * 28 + [1] * 128, dtype=torch.int32)
    m.m_grouped_fp8_fp4_gemm_nt_contiguous((a8, a_s), (b8, b_s), d, m_idx)
    m_idx[120] = 1
    with pytest.raises(AssertionError, match="mixes experts"):
        m.m_grouped_fp8_fp4_gemm_nt_contiguous((a8, a_s), (b8, b_s), d, m_idx)
    m_idx[120], m_idx[64] = -1, -1
    with pytest.raises(AssertionError, match="expert rows must come first"):
        m.m_grouped_fp8_fp4_gemm_nt_contiguous((a8, a_s), (b8, b_s), d, m_idx)
    d3 = torch.empty(2, 128, 128, dtype=torch.bfloat16)
    with pytest.raises(AssertionError, match="masked_m"):
        m.m_grouped_fp8_fp4_gemm_nt_masked((a8.view(2, 128, 128), a_s.view(2, 128, 1)), (b8, b_s), d3,
                                           torch.tensor([3, 4]), 4)


@pytest.mark.parametrize("generation", GENERATIONS)
def test_adapter_hands_deepgemm_what_it_trusts(generation):
    """Misaligned and strided inputs, [S, 1] key scales, an empty and an inverted window: the adapter makes
    them what DeepGEMM takes (the fake would refuse otherwise) and still equals the reference."""
    from dsa_runtime.reference.indexer import ReferenceIndexer

    gen = torch.Generator().manual_seed(12)
    q8, w, k8, k_scale, ks, ke = _ragged_inputs(gen)
    q_odd = _misaligned_e4m3(gen, tuple(q8.shape))
    q_odd.view(torch.uint8).copy_(q8.view(torch.uint8))
    w_strided = w.t().contiguous().t()
    api, _ = _api(generation)
    got = DeepGEMMIndexer(api).logits_ragged(q_odd, w_strided, k8, k_scale[:, None], ks, ke)
    want = ReferenceIndexer().logits_ragged(q8, w, k8, k_scale, ks, ke)
    assert torch.equal(torch.isinf(got), torch.isinf(want)) and bool(torch.isinf(got[2:4]).all())
    fin = torch.isfinite(want)
    assert float((got[fin] - want[fin]).abs().max()) <= 1e-5 * float(want[fin].abs().max())
    # Paged: [B, N, H] weights are accepted; a cache at an odd byte offset is refused with a clear message.
    from dsa_runtime.testing.fp8util import random_e4m3

    pages, n_q, heads = 3, 2, 32
    cache = torch.cat([random_e4m3(gen, (pages, 64 * 128), torch.device("cpu")).view(torch.uint8),
                       torch.full((pages, 64), 0.01).view(torch.uint8)], dim=1)
    table = torch.tensor([[2, 0, 1]], dtype=torch.int32)
    lens = torch.tensor([130], dtype=torch.int32)
    qp = random_e4m3(gen, (1, n_q, heads, 128), torch.device("cpu"))
    wp = torch.randn(1, n_q, heads, generator=gen) * 1e-3
    got = DeepGEMMIndexer(api).logits_paged(qp, wp, cache, lens, table, 192)
    want = ReferenceIndexer().logits_paged(qp, wp.reshape(n_q, heads), cache, lens, table, 192)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    big = torch.zeros(pages * cache.shape[1] + 16, dtype=torch.uint8)
    off = (1 - big.data_ptr()) % 16 or 16
    odd = big[off : off + cache.numel()].view(pages, -1)
    with pytest.raises(ValueError, match="16-byte aligned"):
        DeepGEMMIndexer(api).logits_paged(qp, wp, odd, lens, table, 192)


def test_share_cxx_runtime_puts_libstdcxx_locale_symbols_in_the_global_scope():
    """deep_gemm's extension must bind std::locale's symbols to the process's libstdc++ (the JIT's std::regex
    crashed otherwise): after the call they resolve through the global scope (dlsym(RTLD_DEFAULT))."""
    import ctypes

    from dsa_runtime.plugins.cuda_hopper.deepgemm_api import share_cxx_runtime

    share_cxx_runtime()
    share_cxx_runtime()  # idempotent
    assert hasattr(ctypes.CDLL(None), "_ZNSt6locale7classicEv")
