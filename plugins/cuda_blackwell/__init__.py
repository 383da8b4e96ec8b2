"""Platform plugin for NVIDIA Blackwell data-centre GPUs (SM100/SM103: B200, B300, GB200, GB300).

Defaults follow SGLang's published DeepSeek-V3.2 defaults on Blackwell: FP8 (656-byte) KV cache,
``flashmla_auto`` prefill (sparse prefill for short contexts, the FP8 decode kernel otherwise), ``flashmla_kv``
decode, page size 64. No Blackwell kernel is registered yet: ``auto`` resolves to the reference backend on CUDA.
"""

from __future__ import annotations

from dsa_runtime.hookspecs import hookimpl
from dsa_runtime.platform import Detection, Platform, PlatformDefaults
from dsa_runtime.plugins._nvidia import NVIDIA_REASONS, detect_arch
from dsa_runtime.plugins._pending import pending_family_notes

PLANNED = {
    "indexer": "DeepGEMM fp8_paged_mqa_logits when built; Triton fallback",
    "topk": "FlashInfer top_k_page_table_transform; Triton fallback",
    "sparse_attn": "FlashMLA sparse (flashmla_kv / flashmla_auto); FlashInfer TRT-LLM sparse MLA",
    "kv_quant": "Triton fused quantize-and-store into the 656-byte layout",
    "moe": "DeepGEMM grouped FP8 GEMM; Triton fallback",
}


def detect() -> Detection:
    return detect_arch(10, "SM100/SM103", ("flash_mla", "deep_gemm", "flashinfer"))


def defaults(_: Detection) -> PlatformDefaults:
    return PlatformDefaults(
        kv_layout="fp8_656",
        page_size=64,
        dense_prefill_threshold=2048,
        prefill_attn="flashmla_auto",
        decode_attn="flashmla_kv",
        backends={
            "indexer": ("deepgemm", "triton"),
            "topk": ("flashinfer", "triton"),
            "sparse_attn": ("flashmla_kv", "trtllm", "triton"),
            "kv_quant": ("triton",),
            "moe": ("deepgemm", "triton"),
            "moe_comm": ("nccl",),
        },
        methods={
            "sparse_attn.prefill": ("flashmla_sparse", "flashmla_kv", "triton"),
            "sparse_attn.decode": ("flashmla_kv", "trtllm", "triton"),
        },
        reasons={
            "kv_layout": "SGLang's default on SM>=100: FP8 e4m3 KV in the 656-byte layout",
            "prefill_attn": "SGLang's Blackwell default with FP8 KV: flashmla_auto",
            "decode_attn": "SGLang's Blackwell default with FP8 KV: flashmla_kv",
            **NVIDIA_REASONS,
        },
    )


@hookimpl
def dsa_register_platforms(register):
    register(
        Platform(
            name="cuda_blackwell",
            detect=detect,
            defaults=defaults,
            priority=100,
            family_notes=pending_family_notes("Blackwell", "the reference backend runs on CUDA meanwhile", PLANNED),
            description="NVIDIA SM100/SM103 (B200/B300/GB200/GB300)",
        )
    )
