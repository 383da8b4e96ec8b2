"""Example dsa-runtime backend plugin: registers ``example_topk`` through the ``dsa_runtime.plugins`` group."""

from __future__ import annotations

from dsa_runtime.backend import Backend
from dsa_runtime.capabilities import Capabilities
from dsa_runtime.hookspecs import hookimpl


def _available() -> tuple[bool, str]:
    # A real vendor plugin checks its driver or compiled extension here, cheaply.
    return True, "pure PyTorch"


@hookimpl
def dsa_register_backends(register):
    register(
        Backend(
            name="example_topk",
            capabilities=Capabilities(
                families=frozenset({"topk"}),
                devices=frozenset({"cpu", "cuda"}),
                not_claimed={
                    "indexer": "example plugin: top-k only",
                    "sparse_attn": "example plugin: top-k only",
                    "kv_quant": "example plugin: top-k only",
                    "moe": "example plugin: top-k only",
                },
            ),
            # A "module:attr" string keeps registration free of heavy imports: torch loads on first use.
            kernels={"topk": "dsa_example_backend.topk:TorchTopK"},
            available=_available,
            description="torch.topk over window-masked rows (example of a third-party backend)",
        )
    )
