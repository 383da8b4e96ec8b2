"""Platform plugin for NVIDIA Hopper (SM90: H100, H200, H800, H20).

Defaults follow SGLang's published DeepSeek-V3.2 defaults on Hopper: bf16 KV cache, ``flashmla_sparse`` prefill,
``fa3`` decode, page size 64, dense MHA prefill up to 2048 KV tokens. No Hopper kernel is registered yet, so
``auto`` resolves every family to the reference backend on CUDA (logged), and ``dsa-runtime plugins`` says so.
FlashMLA and DeepGEMM have no usable PyPI release; when a user has built them (``pip install -e`` of their
repositories), their modules ``flash_mla`` / ``deep_gemm`` are detected and reported here.
"""

from __future__ import annotations

from dsa_runtime.hookspecs import hookimpl
from dsa_runtime.platform import Detection, Platform, PlatformDefaults
from dsa_runtime.plugins._nvidia import NVIDIA_REASONS, detect_arch
from dsa_runtime.plugins._pending import pending_family_notes

PLANNED = {
    "indexer": "Triton FP8 logits; DeepGEMM fp8_mqa_logits when built",
    "topk": "Triton radix top-k fused with the page-table transform",
    "sparse_attn": "Triton sparse MLA; FlashMLA sparse prefill / decode when built",
    "kv_quant": "Triton fused quantize-and-store",
    "moe": "Triton grouped routing and FP8 grouped GEMM; DeepGEMM when built",
}
OPTIONAL_LIBS = ("flash_mla", "deep_gemm", "flashinfer", "tilelang", "triton")


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
            "sparse_attn": ("flashmla_sparse", "triton"),
            "kv_quant": ("triton",),
            "moe": ("deepgemm", "triton"),
        },
        methods={
            "sparse_attn.prefill": ("flashmla_sparse", "triton"),
            "sparse_attn.decode": ("fa3", "flashmla_sparse", "triton"),
        },
        reasons={
            "kv_layout": "SGLang's Hopper default: bf16 KV (FP8 KV is the default only on SM>=100)",
            "prefill_attn": "SGLang's Hopper default: flashmla_sparse prefill",
            "decode_attn": "SGLang's Hopper default: fa3 decode over gathered bf16 pages",
            **NVIDIA_REASONS,
        },
    )


@hookimpl
def dsa_register_platforms(register):
    register(
        Platform(
            name="cuda_hopper",
            detect=detect,
            defaults=defaults,
            priority=90,
            family_notes=pending_family_notes("Hopper", "the reference backend runs on CUDA meanwhile", PLANNED),
            description="NVIDIA SM90 (H100/H200/H800/H20)",
        )
    )
