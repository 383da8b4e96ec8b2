"""The CUDA few-head decode's host side without a GPU: configurations, the packaged source, NVRTC discovery and
the switches that keep the Triton kernels (few-head decode and top-k scan)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="needs the triton package (pip install -e '.[test]')")
torch = pytest.importorskip("torch")

from dsa_runtime.plugins.cuda_hopper.cuda import fewhead_fp8, nvrtc, topk_scan  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.cuda.fewhead_fp8 import CudaFewHeadConfig  # noqa: E402


def test_default_options_and_shared_memory():
    cfg = CudaFewHeadConfig()
    assert cfg.options == ("-DSTAGES=2", "-DMIN_BLOCKS=2", "-DRESCALE_SLACK=8.0f", "-DREF_SLACK=16.0f",
                           "-DL2_PREFETCH=128", "-DPARTIAL_F16=1")
    assert cfg.dynamic_smem == 2 * 32 * 688 + 8192  # two stages of 32 rows + the score exchange
    assert cfg.label == "cuda_s2_b2_r8_16_l2p128"
    assert CudaFewHeadConfig(splits=3).label.endswith("_x3_l2p128")
    assert CudaFewHeadConfig(l2_prefetch=0, pdl_merge=False).label == "cuda_s2_b2_r8_16_l2p0_nopdl"
    assert CudaFewHeadConfig(pdl_main=False).label == "cuda_s2_b2_r8_16_l2p128_nopdlmain"
    fp32 = CudaFewHeadConfig(stages=3, partial_fp16=False)  # a former default
    assert fp32.label == "cuda_s3_b2_r8_16_l2p128_pf32" and fp32.options[-1] == "-DPARTIAL_F16=0"


def test_kernel_source_defaults_match_the_config():
    """A compile without options (cuda_compile's first look, a hand build) gets the default configuration."""
    source = fewhead_fp8._source()
    cfg = CudaFewHeadConfig()
    assert f"#ifndef STAGES\n#define STAGES {cfg.stages}\n" in source
    assert f"#ifndef PARTIAL_F16\n#define PARTIAL_F16 {int(cfg.partial_fp16)}\n" in source
    assert f"#ifndef MIN_BLOCKS\n#define MIN_BLOCKS {cfg.min_blocks}\n" in source


def test_shared_memory_is_sized_from_the_kernel_source(monkeypatch):
    assert fewhead_fp8.source_layout() == {"CHUNK": 32, "PITCH": 688, "XCHG_BYTES": 4 * 4 * 32 * 16}
    edited = fewhead_fp8._source().replace("#define PITCH 688", "#define PITCH 704")
    monkeypatch.setattr(fewhead_fp8, "_source", lambda: edited)
    fewhead_fp8.source_layout.cache_clear()
    try:
        assert CudaFewHeadConfig(stages=4).dynamic_smem == 4 * 32 * 704 + 8192
        monkeypatch.setattr(fewhead_fp8, "_source", lambda: edited.replace("#define CHUNK 32", "#define CHUNK ROWS"))
        fewhead_fp8.source_layout.cache_clear()
        with pytest.raises(RuntimeError, match="CHUNK, PITCH and XCHG_BYTES"):
            fewhead_fp8.source_layout()
    finally:
        fewhead_fp8.source_layout.cache_clear()


@pytest.mark.parametrize(
    "bad",
    [CudaFewHeadConfig(stages=1), CudaFewHeadConfig(rescale_slack=11.0), CudaFewHeadConfig(ref_slack=0.5),
     CudaFewHeadConfig(l2_prefetch=512)],
)
def test_configurations_that_could_overflow_fp16_are_refused(bad):
    with pytest.raises(ValueError):
        bad.options  # noqa: B018 - the property validates


def test_supported_shapes():
    assert fewhead_fp8.supported(16, 512) and fewhead_fp8.supported(1, 512)
    assert not fewhead_fp8.supported(17, 512)
    assert fewhead_fp8.supported(32, 512) and fewhead_fp8.head_groups(32) == 2 and fewhead_fp8.head_groups(16) == 1
    assert not fewhead_fp8.supported(48, 512) and not fewhead_fp8.supported(64, 512)
    assert not fewhead_fp8.supported(16, 256)
    assert not fewhead_fp8.supported(0, 512)


def test_source_is_packaged_with_its_entry_point():
    src = fewhead_fp8._source()
    assert 'extern "C" __global__' in src and "fewhead_fp8_decode(" in src


def test_cpu_tensors_never_take_the_cuda_kernel():
    q = torch.zeros(1, 1, 16, 576, dtype=torch.bfloat16)
    assert fewhead_fp8.use_cuda_kernel(q, 512) is False


@pytest.mark.parametrize("module", [fewhead_fp8, topk_scan], ids=["fewhead_fp8", "topk_scan"])
def test_switch_off_is_honoured_before_any_device_query(monkeypatch, module):
    monkeypatch.setenv(module.ENV_SWITCH, "0")
    module.enabled.cache_clear()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: pytest.fail("queried the device"))
    try:
        assert module.enabled(0) is False
    finally:
        module.enabled.cache_clear()


def test_nvrtc_override_is_tried_first(monkeypatch):
    monkeypatch.setenv("DSA_NVRTC_LIB", "/opt/custom/libnvrtc.so.13")
    assert nvrtc._candidates()[0] == "/opt/custom/libnvrtc.so.13"


def test_missing_nvrtc_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr(nvrtc, "_candidates", lambda: ["/nonexistent/libnvrtc.so.99"])
    nvrtc.nvrtc.cache_clear()
    try:
        with pytest.raises(nvrtc.NvrtcUnavailable, match="nvidia-cuda-nvrtc"):
            nvrtc.nvrtc()
        assert nvrtc.available() is False
    finally:
        nvrtc.nvrtc.cache_clear()


def test_load_kernel_targets_the_arch_specific_architecture(monkeypatch):
    seen: list[str] = []

    def compile_cubin(source, arch, options=()):
        seen.append(arch)
        raise RuntimeError("stop before loading")

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setattr(nvrtc, "compile_cubin", compile_cubin)
    for suffix in ("", "a"):
        with pytest.raises(RuntimeError, match="stop before loading"):
            nvrtc.load_kernel("// src", "k", (), 0, torch.device("cuda", 0), arch_suffix=suffix)
    assert seen == ["sm_90", "sm_90a"]


@pytest.mark.parametrize(("top_k", "splits", "block_n", "want"), [
    (2048, 4, 32, (4, 512)),   # even slices
    (2048, 3, 32, (3, 704)),   # 683 rounded up to whole 32-row blocks
    (100, 4, 64, (2, 64)),     # 4 slices of 25 rows round to 64: two cover all 100
    (40, 8, 32, (2, 32)),
    (1, 4, 32, (1, 32)),
    (0, 1, 32, (1, 32)),       # an empty selection still gets one slice (it writes -inf / +inf)
])
def test_slice_rows_rounds_to_blocks_and_drops_empty_slices(top_k, splits, block_n, want):
    from dsa_runtime.plugins.cuda_hopper.triton.fewhead_plan import slice_rows

    got = slice_rows(top_k, splits, block_n)
    assert got == want
    n, per = got
    assert per % block_n == 0 and (n - 1) * per < max(top_k, 1) <= n * per  # every slice has rows
