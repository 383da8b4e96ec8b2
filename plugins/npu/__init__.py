"""Platform plugin for Huawei Ascend NPUs (torch-npu).

The fused torch-npu operators for DSA (``npu_lightning_indexer``, ``npu_sparse_flash_attention``,
``npu_kv_quant_sparse_flash_attention``...) are the planned kernels. None is wired yet, and the reference
backend has not been validated on the ``npu`` device, so ``auto`` on Ascend resolves to the reference on CPU.
"""

from __future__ import annotations

from dsa_runtime.hookspecs import hookimpl
from dsa_runtime.hw_probe import probe_ascend
from dsa_runtime.platform import Detection, Platform, PlatformDefaults
from dsa_runtime.plugins._pending import pending_family_notes

PLANNED = {
    "indexer": "torch_npu.npu_lightning_indexer / npu_quant_lightning_indexer",
    "topk": "selection fused in npu_lightning_indexer (sparse_count 2048)",
    "sparse_attn": "torch_npu.npu_sparse_flash_attention / npu_kv_quant_sparse_flash_attention",
    "kv_quant": "torch_npu.npu_mla_prolog_v3 fused quantization",
    "moe": "torch_npu grouped matmul",
}


def detect() -> Detection:
    count, reason = probe_ascend()
    return Detection(count > 0, reason, device="cpu" if count else None)


def defaults(_: Detection) -> PlatformDefaults:
    return PlatformDefaults(
        kv_layout="bf16",
        page_size=64,
        dense_prefill_threshold=2048,
        prefill_attn="reference",
        decode_attn="reference",
        backends={},
        reasons={
            "kv_layout": "bf16 KV until the Ascend quantized-KV operators are wired",
            "backends": "no Ascend kernel yet; the reference backend on CPU is the only validated path",
        },
    )


@hookimpl
def dsa_register_platforms(register):
    register(
        Platform(
            name="npu",
            detect=detect,
            defaults=defaults,
            priority=70,
            family_notes=pending_family_notes("Ascend", "the reference backend runs on CPU meanwhile", PLANNED),
            description="Huawei Ascend NPU (torch-npu)",
        )
    )
