"""Built-in plugin: the ``cpu`` platform, the ``reference`` backend (plain PyTorch, every family, the kit's
oracle) and the ``torch`` backend (plain PyTorch tuned for CPU speed, ``dsa_runtime.torch_kernels``)."""

from __future__ import annotations

from dsa_runtime.backend import Backend
from dsa_runtime.capabilities import Capabilities
from dsa_runtime.families import FAMILIES
from dsa_runtime.hookspecs import hookimpl
from dsa_runtime.platform import Detection, Platform, PlatformDefaults
from dsa_runtime.torch_kernels.backend import torch_backend

KERNELS = {
    "indexer": "dsa_runtime.reference.indexer:ReferenceIndexer",
    "topk": "dsa_runtime.reference.topk:ReferenceTopK",
    "sparse_attn": "dsa_runtime.reference.sparse_attn:ReferenceSparseAttn",
    "kv_quant": "dsa_runtime.reference.kv_quant:ReferenceKVQuant",
    "moe": "dsa_runtime.reference.moe:ReferenceMoE",
    "moe_comm": "dsa_runtime.reference.moe_comm:ReferenceMoEComm",
}


def reference_backend() -> Backend:
    """The oracle of the conformance kit: every family, every claim, CPU and CUDA, fp32 accumulation."""
    return Backend(
        name="reference",
        capabilities=Capabilities(families=frozenset(FAMILIES), devices=frozenset({"cpu", "cuda"})),
        kernels=KERNELS,
        platform="cpu",
        description="plain PyTorch, fp32 accumulation, exactly per core/families.py; for correctness, not speed",
    )


def _detect_cpu() -> Detection:
    return Detection(present=True, reason="a CPU is always present", device="cpu")


# Logged with every method resolved on the CPU (``<method> -> torch (cpu default: ...)``).
_CPU_BACKEND_REASON = "torch first (vectorised PyTorch for CPU, kit-certified), reference as the fallback"


def _cpu_defaults(_: Detection) -> PlatformDefaults:
    return PlatformDefaults(
        kv_layout="bf16",
        page_size=64,
        dense_prefill_threshold=2048,
        prefill_attn="torch",
        decode_attn="torch",
        backends=dict.fromkeys(FAMILIES, ("torch", "reference")),
        reasons={
            "kv_layout": "bf16 KV: no FP8 arithmetic advantage on CPU",
            "page_size": "64, the page size every GPU kernel uses, so caches are interchangeable",
            "backends": "torch (batched GEMMs, torch.topk, bf16 MoE GEMMs; certified against reference by the "
            "conformance kit) first, the reference oracle as the fallback",
            **dict.fromkeys(FAMILIES, _CPU_BACKEND_REASON),
        },
    )


@hookimpl
def dsa_register_platforms(register):
    register(
        Platform(
            name="cpu",
            detect=_detect_cpu,
            defaults=_cpu_defaults,
            priority=0,
            description="any CPU; runs the torch backend (reference as the fallback)",
        )
    )


@hookimpl
def dsa_register_backends(register):
    register(reference_backend())
    register(torch_backend())
