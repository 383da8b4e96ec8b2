"""The ``deepgemm`` backend on CPU: registration, availability, API generations, and the claimed kit cases
through a plain-torch fake ``deep_gemm`` (tests/hopper/fake_deep_gemm.py), which checks our layout translation."""

from __future__ import annotations

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
    assert resolved.backend_of("indexer.logits_paged") == "deepgemm"
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
