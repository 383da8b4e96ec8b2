"""One conformance case: seeded inputs, how to run a kernel on them, and how to judge the result.

A case is data plus three callables; the runner (:mod:`dsa_runtime.testing.runner`) does the rest:

1. ``build(gen, device)`` makes the inputs (seeded by the case id, so a case is reproducible);
2. ``run(kernel, inputs)`` calls the family kernel, once for the backend under test and once for the
   reference, each on its own copy of the inputs (in-place kernels return the tensor they wrote);
3. ``check(ctx)`` compares and returns ``None`` (pass) or a message saying what differed. The runner
   prefixes the message with the family and the case id.

This module imports no torch: case tables are built lazily, and the pytest plugin stays cheap.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

Tier = Literal["quick", "full"]
Status = Literal["passed", "failed", "error", "not_claimed"]
Inputs = dict[str, Any]


@dataclass
class CheckContext:
    """What a checker sees.

    Attributes:
        case: the case being judged.
        inputs: the pristine inputs (device of the backend under test; never passed to a kernel).
        got: the backend's result (same device).
        want: the reference's result, moved to the backend's device.
        kernel: the backend's family kernel object (checkers may call it, e.g. its dequantizer).
        oracle: the reference's family kernel object (runs on ``oracle_device``).
        device, oracle_device: torch devices of the two.
    """

    case: Case
    inputs: Inputs
    got: Any
    want: Any
    kernel: Any
    oracle: Any
    device: torch.device
    oracle_device: torch.device

    def to_oracle(self, x: Any) -> Any:
        """Move a tensor (or nested tuple/list/dict of tensors) to the oracle's device."""
        return move(x, self.oracle_device)

    def to_device(self, x: Any) -> Any:
        """Move a tensor (or nested structure) to the backend's device."""
        return move(x, self.device)


Builder = Callable[["torch.Generator", "torch.device"], Inputs]
Runner = Callable[[Any, Inputs], Any]
Checker = Callable[[CheckContext], "str | None"]


@dataclass(frozen=True)
class Case:
    """A conformance case.

    Attributes:
        id: stable, unique, ``/``-separated (``sparse_attn/decode/fp8_656/h20/k64/q2/p64/partial_pages``).
        family: kernel family (``indexer``, ``topk``, ``sparse_attn``, ``kv_quant``, ``moe``).
        tier: ``quick`` (small shapes, CPU friendly) or ``full`` (V3.2's real shapes, meant for a GPU).
        needs: capability needs passed to :meth:`Capabilities.unclaimed_reason` with :attr:`method` (the
            device is added by the runner).
        build, run, check: see the module docstring.
        description: one line on what the case covers.
    """

    id: str
    family: str
    tier: Tier
    needs: Mapping[str, object]
    build: Builder = field(repr=False)
    run: Runner = field(repr=False)
    check: Checker = field(repr=False)
    description: str = ""

    @property
    def seed(self) -> int:
        """Seed of the input builder: a stable hash of the id (same inputs on every run and machine)."""
        return zlib.crc32(self.id.encode())

    @property
    def method(self) -> str:
        """The kernel method the case calls, ``family.method`` (the id's second part), e.g. ``sparse_attn.prefill``."""
        return f"{self.family}.{self.id.split('/')[1]}"


def move(x: Any, device: Any) -> Any:
    """Move tensors inside ``x`` (tensor, tuple, list, dict, dataclass-free) to ``device``; other values pass."""
    if hasattr(x, "to") and hasattr(x, "device") and hasattr(x, "dtype"):
        return x if x.device == device else x.to(device)
    if isinstance(x, dict):
        return {k: move(v, device) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        moved = [move(v, device) for v in x]
        return type(x)(moved) if isinstance(x, list) else tuple(moved)
    if hasattr(x, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.replace(x, **{f: move(getattr(x, f), device) for f in x.__dataclass_fields__})
    return x


def clone(x: Any) -> Any:
    """Deep-copy the tensors inside ``x`` so that an in-place kernel cannot touch the pristine inputs."""
    if hasattr(x, "clone") and hasattr(x, "dtype"):
        return x.clone()
    if isinstance(x, dict):
        return {k: clone(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        cloned = [clone(v) for v in x]
        return cloned if isinstance(x, list) else tuple(cloned)
    if hasattr(x, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.replace(x, **{f: clone(getattr(x, f)) for f in x.__dataclass_fields__})
    return x
