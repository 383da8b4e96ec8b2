"""Platform plugin for AMD Instinct GPUs under ROCm (MI300X/MI325X/MI355X).

Defaults follow SGLang on ROCm: TileLang kernels for DSA prefill and decode (aiter as the alternative decode
backend), bf16 KV, page size 1 (SGLang's ROCm page size). No ROCm kernel is registered yet: ``auto`` resolves to
the reference backend, which runs under PyTorch's ROCm build (device type ``cuda``).
"""

from __future__ import annotations

from dsa_runtime.hookspecs import hookimpl
from dsa_runtime.hw_probe import module_available, probe_amd
from dsa_runtime.platform import Detection, Platform, PlatformDefaults
from dsa_runtime.plugins._pending import pending_family_notes

PLANNED = {
    "indexer": "TileLang FP8 lightning indexer; aiter fp8_mqa_logits",
    "topk": "TileLang top-k selector; aiter top_k_per_row",
    "sparse_attn": "TileLang sparse MLA; aiter mla_decode_fwd",
    "kv_quant": "TileLang / Triton quantize-and-store",
    "moe": "aiter fused MoE",
}


def detect() -> Detection:
    targets, reason = probe_amd()
    libs = {lib: "found" if module_available(lib) else "not installed" for lib in ("aiter", "tilelang")}
    return Detection(bool(targets), reason, device="cuda" if targets else None, details=libs)


def defaults(_: Detection) -> PlatformDefaults:
    return PlatformDefaults(
        kv_layout="bf16",
        page_size=1,
        dense_prefill_threshold=2048,
        prefill_attn="tilelang",
        decode_attn="tilelang",
        backends={
            "indexer": ("tilelang", "aiter"),
            "topk": ("tilelang", "aiter"),
            "sparse_attn": ("tilelang", "aiter"),
            "kv_quant": ("tilelang",),
            "moe": ("aiter",),
        },
        methods={"sparse_attn.prefill": ("tilelang",), "sparse_attn.decode": ("tilelang", "aiter")},
        reasons={
            "kv_layout": "bf16 KV: SGLang enables FP8 KV by default only on NVIDIA SM>=100",
            "prefill_attn": "SGLang uses TileLang for DSA prefill on MI300/MI350",
            "decode_attn": "TileLang (aiter decode is the alternative)",
            "page_size": "SGLang's page size on ROCm is 1",
        },
    )


@hookimpl
def dsa_register_platforms(register):
    register(
        Platform(
            name="rocm",
            detect=detect,
            defaults=defaults,
            priority=80,
            family_notes=pending_family_notes("ROCm", "the reference backend runs under ROCm PyTorch meanwhile", PLANNED),
            description="AMD Instinct under ROCm (MI300X/MI325X/MI355X)",
        )
    )
