"""The ``torch`` backend object: every family, CPU, registered by the built-in plugin (``reference/plugin.py``)."""

from __future__ import annotations

from dsa_runtime.backend import Backend
from dsa_runtime.capabilities import Capabilities
from dsa_runtime.families import FAMILIES

KERNELS = {
    "indexer": "dsa_runtime.torch_kernels.indexer:TorchIndexer",
    "topk": "dsa_runtime.torch_kernels.topk:TorchTopK",
    "sparse_attn": "dsa_runtime.torch_kernels.sparse_attn:TorchSparseAttn",
    "kv_quant": "dsa_runtime.torch_kernels.kv_quant:TorchKVQuant",
    "moe": "dsa_runtime.torch_kernels.moe:TorchMoE",
    "moe_comm": "dsa_runtime.torch_kernels.moe_comm:TorchMoEComm",
}


def torch_backend() -> Backend:
    """Plain PyTorch tuned for CPUs: batched GEMMs, ``torch.topk``, cached bf16 expert weights."""
    return Backend(
        name="torch",
        capabilities=Capabilities(families=frozenset(FAMILIES), devices=frozenset({"cpu"})),
        kernels=KERNELS,
        platform="cpu",
        description="plain PyTorch tuned for CPU (batched GEMMs, torch.topk, bf16 MoE GEMMs, fixed-capacity EP "
        "all-to-all); certified by the kit",
    )
