"""Backend ``deepgemm``: DeepSeek's DeepGEMM kernels (indexer logits, FP8 grouped expert GEMMs) on SM90.

Registered with the ``cuda_hopper`` platform and *available* only when the ``deep_gemm`` module is installed
(found without importing it: importing it initialises CUDA) and an SM90 GPU is visible; otherwise
``dsa-runtime plugins`` shows why. DeepGEMM has no usable PyPI release: ``tools/gpu/build_deepgemm.sh`` builds
it (docs/hopper.md, section "DeepGEMM").

Claims stay inside DeepGEMM's SM90 limits (``csrc/apis/attention.hpp``): 32 or 64 index heads, head dim 128,
page size 64, 1 or 2 queries per request. ``indexer.quantize_q`` / ``quantize_k`` and ``moe.route`` are not
DeepGEMM kernels: they are left unclaimed, so resolution takes them per method from the next backend of the
platform's preference list (``triton``, else ``reference``). ``moe.experts`` is claimed for FP8 block-scaled
weights only (DeepGEMM's grouped GEMMs take 128x128 weight scales); bf16 experts go to the next backend.
"""

from __future__ import annotations

from dsa_runtime.backend import Backend
from dsa_runtime.capabilities import Capabilities, MethodClaim, ValueSet
from dsa_runtime.hw_probe import module_available

INDEX_HEADS = ValueSet.one_of(32, 64)  # SM90 fp8 MQA logits: num_heads == 32 or 64
DEEPGEMM_CLAIMS: dict[str, MethodClaim] = {
    "indexer.logits_ragged": MethodClaim(index_heads=INDEX_HEADS),
    "indexer.logits_paged": MethodClaim(
        index_heads=INDEX_HEADS, page_sizes=ValueSet.one_of(64), decode_queries=ValueSet.one_of(1, 2)
    ),
    "moe.experts": MethodClaim(weight_dtypes=ValueSet.one_of("fp8_e4m3")),
}
NOT_A_DEEPGEMM_KERNEL = "not a DeepGEMM kernel: resolved from the next backend (triton, else reference)"
DEEPGEMM_NOT_CLAIMED = {
    "indexer.quantize_q": NOT_A_DEEPGEMM_KERNEL,
    "indexer.quantize_k": NOT_A_DEEPGEMM_KERNEL,
    "moe.route": NOT_A_DEEPGEMM_KERNEL,
    "topk": "DeepGEMM has no top-k",
    "sparse_attn": "DeepGEMM has no sparse attention (see flashmla_sparse)",
    "kv_quant": "DeepGEMM has no KV-cache quantization",
}
DEEPGEMM_KERNELS = {
    "indexer": "dsa_runtime.plugins.cuda_hopper.deepgemm_indexer:DeepGEMMIndexer",
    "moe": "dsa_runtime.plugins.cuda_hopper.deepgemm_moe:DeepGEMMMoE",
}


def deepgemm_available() -> tuple[bool, str]:
    """``deep_gemm`` is installed and an SM90 GPU is visible (neither torch nor deep_gemm is imported)."""
    if not module_available("deep_gemm"):
        return False, "deep_gemm is not installed (build it with tools/gpu/build_deepgemm.sh; docs/hopper.md)"
    from dsa_runtime.plugins.cuda_hopper import on_sm90  # late: the platform module imports this one

    return on_sm90((True, "deep_gemm installed"))


def deepgemm_backend() -> Backend:
    """The ``deepgemm`` backend: indexer logits (ragged, paged) and FP8 grouped experts."""
    return Backend(
        name="deepgemm",
        capabilities=Capabilities(
            devices=frozenset({"cuda"}), methods=DEEPGEMM_CLAIMS, not_claimed=DEEPGEMM_NOT_CLAIMED
        ),
        kernels=DEEPGEMM_KERNELS,
        available=deepgemm_available,
        platform="cuda_hopper",
        description="DeepGEMM (SM90): FP8 indexer logits, ragged and paged; FP8 grouped expert GEMMs",
    )
