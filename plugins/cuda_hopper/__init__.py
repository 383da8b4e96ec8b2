"""Platform plugin for NVIDIA Hopper (SM90: H100, H200, H800, H20).

Defaults follow SGLang's published DeepSeek-V3.2 defaults on Hopper: bf16 KV cache, ``flashmla_sparse`` prefill,
``fa3`` decode, page size 64, dense MHA prefill up to 2048 KV tokens.

Backend ``triton`` (kernels in :mod:`.triton`, one module per concept) provides all five families (``indexer``,
``topk``, ``sparse_attn``, ``kv_quant``, ``moe``) with per-method claims; it is available when the ``triton``
package is installed and an SM90 GPU is visible (checked without importing triton or initialising CUDA).
FlashMLA and DeepGEMM have no usable PyPI release; when a user has built them (``pip install -e`` of their
repositories), their modules ``flash_mla`` / ``deep_gemm`` are detected and reported here. The FlashMLA adapters
``flashmla_sparse`` (prefill) and ``flashmla_kv`` (FP8 decode) of :mod:`.flashmla` are always registered and
available only with a built ``flash_mla`` on an SM90 GPU (``dsa-runtime plugins`` says why not otherwise).
Backend ``tilelang`` (:mod:`.tilelang`) runs our own TileLang sparse MLA kernels (prefill, bf16 and ``fp8_656``
decode at 64 / 128 heads, k a multiple of 64); it is available when the ``tilelang`` package is installed and an SM90 GPU is
visible, and sits between FlashMLA and Triton in ``auto``.
"""

from __future__ import annotations

from dsa_runtime.backend import Backend
from dsa_runtime.capabilities import Capabilities
from dsa_runtime.hookspecs import hookimpl
from dsa_runtime.hw_probe import module_available
from dsa_runtime.platform import Detection, Platform, PlatformDefaults
from dsa_runtime.plugins._nvidia import NVIDIA_REASONS, detect_arch
from dsa_runtime.plugins._pending import pending_family_notes

PLANNED = {
    "indexer": "Triton FP8 logits; DeepGEMM fp8_mqa_logits for prefill when built",
    "topk": "Triton radix top-k fused with the page-table transform",
    "sparse_attn": "Triton sparse MLA; FlashMLA sparse prefill / decode when built",
    "kv_quant": "Triton fused quantize-and-store",
    "moe": "Triton grouped routing and FP8 grouped GEMM; DeepGEMM when built",
}
OPTIONAL_LIBS = ("flash_mla", "deep_gemm", "tilelang", "triton")
# Families the ``triton`` backend provides, as "module:Class" strings (imported on first use).
TRITON_KERNELS = {
    "moe": "dsa_runtime.plugins.cuda_hopper.triton.moe_experts:TritonMoE",
    "indexer": "dsa_runtime.plugins.cuda_hopper.triton.indexer:TritonIndexer",
    "sparse_attn": "dsa_runtime.plugins.cuda_hopper.triton.sparse_attn:TritonSparseAttn",
    "kv_quant": "dsa_runtime.plugins.cuda_hopper.triton.kv_quant:TritonKVQuant",
    "topk": "dsa_runtime.plugins.cuda_hopper.triton.topk:TritonTopK",
}


def detect() -> Detection:
    return detect_arch(9, "SM90", OPTIONAL_LIBS)


def defaults(_: Detection) -> PlatformDefaults:
    return PlatformDefaults(
        kv_layout="bf16",
        page_size=64,
        dense_prefill_threshold=2048,
        prefill_attn="flashmla_sparse",
        decode_attn="fa3",
        backends={
            "indexer": ("deepgemm", "triton"),
            "topk": ("triton",),
            "sparse_attn": ("flashmla_sparse", "flashmla_kv", "tilelang", "triton"),
            "kv_quant": ("triton",),
            "moe": ("deepgemm", "triton"),
            "moe_comm": ("nccl",),
        },
        methods={
            "sparse_attn.prefill": ("flashmla_sparse", "tilelang", "triton"),
            # fa3 (SGLang's Hopper decode) is not registered here: it falls through, logged. flashmla_kv claims
            # only the fp8_656 cache, so a bf16-KV engine skips it (the KV layout is part of the decode needs).
            "sparse_attn.decode": ("fa3", "flashmla_kv", "tilelang", "triton"),
            # Measured beside DeepGEMM 54e2261 on one H200 (2026-11-26, bench/selection.py): our paged logits
            # 0.313 vs 0.338 ms at 64 x 128K, 0.621 vs 0.649 at 128 x 128K, 0.171 vs 0.187 at 128 x 32K, 0.020 vs
            # 0.098 at 1 x 128K; DeepGEMM ahead only at 64 x 32K (0.110 vs 0.117). Prefill stays DeepGEMM's.
            "indexer.logits_paged": ("triton", "deepgemm"),
        },
        by_heads={
            ("sparse_attn.decode", "fp8_656", 128): ("fa3", "tilelang", "flashmla_kv", "triton"),
        },
        reasons={
            "kv_layout": "SGLang's Hopper default: bf16 KV (FP8 KV is the default only on SM>=100)",
            "prefill_attn": "SGLang's Hopper default: flashmla_sparse prefill",
            "decode_attn": "SGLang's Hopper default: fa3 decode over gathered bf16 pages",
            "sparse_attn": "SGLang's Hopper choices: flashmla_sparse prefill, fa3 decode (not provided here), "
            "flashmla_kv for an FP8 cache (our TileLang wsf8c first at 128 heads, measured faster), else our TileLang "
            "kernels (bf16 KV; fp8_656 decode), else Triton",
            "sparse_attn.decode@fp8_656/128": "tilelang's wsf8c before flashmla_kv, measured on one H200 "
            "(2026-11-27, CUDA graphs, 32K, k 2048): batch 64 96.0 against 99.3 us, 2 queries 183.7 against 189.4; "
            "flashmla_kv stays ahead at batch 1 (22.2 against 23.3 us) and at 64 heads (80.5 against 90.1 at batch 64)",
            "moe": "Triton fused grouped routing + FP8 block-scaled grouped GEMMs (DeepGEMM first when registered)",
            "moe_comm": "fixed-capacity NCCL all-to-all: stays inside captured decode graphs (deepep when asked for)",
            **NVIDIA_REASONS,
        },
    )


def on_sm90(library: tuple[bool, str]) -> tuple[bool, str]:
    """A backend's availability: its library check ``(found, why)``, then an SM90 GPU (NVML probe; neither torch
    nor the library is imported). The reason names both."""
    found, why = library
    if not found:
        return False, why
    detection = detect()
    if not detection.present:
        return False, detection.reason
    return True, f"{why}; {detection.reason}"


def triton_available() -> tuple[bool, str]:
    """``triton`` is installed and an SM90 GPU is visible (NVML probe; triton itself is not imported)."""
    if not module_available("triton"):
        return False, "the triton package is not installed (pip install 'dsa-runtime[hopper]')"
    return on_sm90((True, "triton installed"))


def triton_backend() -> Backend:
    """The ``triton`` backend of this platform: only the families in :data:`TRITON_KERNELS` so far."""
    # The claim modules import neither torch nor triton (plugin discovery stays light).
    from dsa_runtime.plugins.cuda_hopper.triton.indexer import INDEXER_CLAIMS
    from dsa_runtime.plugins.cuda_hopper.triton.kv_quant import KV_QUANT_CLAIMS
    from dsa_runtime.plugins.cuda_hopper.triton.sparse_attn import SPARSE_ATTN_CLAIMS
    from dsa_runtime.plugins.cuda_hopper.triton.topk import TOPK_CLAIMS

    return Backend(
        name="triton",
        capabilities=Capabilities(
            families=frozenset({"moe"}),  # family-level claim (any heads/k/...); the others claim per method
            methods={**SPARSE_ATTN_CLAIMS, **INDEXER_CLAIMS, **KV_QUANT_CLAIMS, **TOPK_CLAIMS},
            devices=frozenset({"cuda"}),
            weight_dtypes=frozenset({"bf16", "fp8_e4m3"}),
            scale_fmts=frozenset({"ue8m0", "float"}),
            not_claimed={
                f: f"no Triton kernel yet (planned: {PLANNED[f]})" for f in PLANNED if f not in TRITON_KERNELS
            },
        ),
        kernels=TRITON_KERNELS,
        available=triton_available,
        platform="cuda_hopper",
        description="Triton kernels for SM90: lightning indexer, exact top-k, sparse MLA prefill/decode (bf16 and FP8 "
        "caches; FP8 decode at <= 16 heads in our CUDA C++ when NVRTC is found), KV quantize/store, MoE routing and "
        "fused FP8/bf16 grouped experts",
    )


def tilelang_backend() -> Backend:
    """The ``tilelang`` backend: our TileLang sparse MLA (claims read without importing tilelang or torch)."""
    from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_attn import (
        TILELANG_SPARSE_ATTN_CLAIMS,
        tilelang_available,
    )

    return Backend(
        name="tilelang",
        capabilities=Capabilities(devices=frozenset({"cuda"}), methods=TILELANG_SPARSE_ATTN_CLAIMS),
        kernels={"sparse_attn": "dsa_runtime.plugins.cuda_hopper.tilelang.sparse_attn:TileLangSparseAttn"},
        available=tilelang_available,
        platform="cuda_hopper",
        description="our TileLang sparse MLA for SM90 (wgmma, gathered KV in shared memory): prefill, bf16 "
        "and fp8_656 decode, 64/128 heads, k % 64",
    )


@hookimpl
def dsa_register_platforms(register):
    register(
        Platform(
            name="cuda_hopper",
            detect=detect,
            defaults=defaults,
            priority=90,
            family_notes={
                f: note
                for f, note in pending_family_notes(
                    "Hopper", "the reference backend runs on CUDA meanwhile", PLANNED
                ).items()
                if f not in TRITON_KERNELS
            },
            description="NVIDIA SM90 (H100/H200/H800/H20)",
        )
    )


@hookimpl
def dsa_register_backends(register):
    from dsa_runtime.plugins.cuda_hopper.deepgemm import deepgemm_backend
    from dsa_runtime.plugins.cuda_hopper.flashmla import flashmla_backends
    from dsa_runtime.plugins.cuda_hopper.moe_comm import moe_comm_backends

    register(triton_backend())
    for backend in flashmla_backends():
        register(backend)
    register(tilelang_backend())
    register(deepgemm_backend())
    for backend in moe_comm_backends():
        register(backend)
