"""Head and k padding for sparse-attention backends that claim only some head counts or k values.

FlashMLA-shaped kernels run 64 or 128 query heads and k a multiple of 64 / 128; a model sharded for tensor
parallelism asks for fewer heads per rank (128 heads / TP 8 = 16; the tiny presets' 4 or 2). Instead of
skipping such a backend, the caller pads:

* query heads with zeros up to the smallest claimed head count that fits, then trims ``out`` and ``lse``
  back (a zero query head attends uniformly over its selection; its output is discarded, and heads never
  mix inside the kernel, so the kept heads are exactly the unpadded result);
* the index tensor's last dimension with ``-1`` (empty) up to the smallest claimed k that fits (``-1``
  entries contribute nothing by contract).

:func:`pad_target` says what a value pads to under a :class:`~dsa_runtime.capabilities.ValueSet`;
:class:`PaddedSparseAttn` wraps one ``sparse_attn`` method; resolution (``resolve.py``) and the conformance
kit (``testing/runner.py``) both use them, so the certified path is the path the engine runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from dsa_runtime.capabilities import MethodClaim, ValueSet

# Methods whose callers pad, and the capability keys they pad (claim attribute names in MethodClaim).
PADDED_METHODS: dict[str, dict[str, str]] = {
    "sparse_attn.prefill": {"heads": "heads", "k": "k"},
    "sparse_attn.decode": {"heads": "heads", "k": "k"},
}


def pad_target(allowed: ValueSet, value: int) -> int | None:
    """The smallest value ``>= value`` that ``allowed`` claims (``value`` itself when claimed), or None."""
    if allowed.allows(value):
        return value
    if allowed.step is not None:
        assert allowed.lo is not None and allowed.hi is not None
        target = max(value, allowed.lo)
        target = -(-target // allowed.step) * allowed.step
        return target if target <= allowed.hi else None
    if allowed.values is None:
        return value
    fits = [v for v in allowed.values if isinstance(v, int) and not isinstance(v, bool) and v >= value]
    return min(fits) if fits else None


def padded_needs(method: str, claim: MethodClaim | None, needs: Mapping[str, object]) -> dict[str, object]:
    """``needs`` with each paddable key replaced by the value it pads to under ``claim`` (when one fits)."""
    out = dict(needs)
    keys = PADDED_METHODS.get(method)
    if claim is None or not keys:
        return out
    for key, attr in keys.items():
        value = out.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            target = pad_target(getattr(claim, attr), value)
            if target is not None:
                out[key] = target
    return out


def head_padding(method: str, claim: MethodClaim | None, needs: Mapping[str, object]) -> float:
    """How many times the heads ``claim`` makes the caller of ``method`` pad to (1.0: none, or nothing fits)."""
    heads = needs.get("heads")
    if not isinstance(heads, int) or isinstance(heads, bool) or heads <= 0:
        return 1.0
    target = padded_needs(method, claim, needs).get("heads", heads)
    return float(target) / heads if isinstance(target, int) else 1.0


def padding_note(method: str, claim: MethodClaim | None, needs: Mapping[str, object]) -> str:
    """``"pads heads 4 -> 64, k 32 -> 128"`` for what the caller pads, or ``""`` when nothing is."""
    padded = padded_needs(method, claim, needs)
    parts = [f"{k} {needs[k]} -> {padded[k]}" for k in PADDED_METHODS.get(method, {}) if padded.get(k) != needs.get(k)]
    return f"pads {', '.join(parts)}" if parts else ""


def needs_wrapper(method: str, claim: MethodClaim | None) -> bool:
    """Whether calls to ``method`` under ``claim`` may need padding (the claim narrows heads or k)."""
    keys = PADDED_METHODS.get(method)
    return bool(claim is not None and keys and any(not getattr(claim, a).is_any for a in keys.values()))


def _target(claim: MethodClaim, attr: str, value: int, what: str, method: str) -> int:
    target = pad_target(getattr(claim, attr), value)
    if target is None:
        raise ValueError(f"{method}: {what} {value} cannot be padded to a claimed value "
                         f"({getattr(claim, attr).describe()})")
    return target


def _pad_dim(x: Tensor, dim: int, size: int, value: float) -> Tensor:
    if x.shape[dim] == size:
        return x
    shape = list(x.shape)
    shape[dim] = size - x.shape[dim]
    return torch.cat([x, torch.full(shape, value, dtype=x.dtype, device=x.device)], dim=dim)


class PaddedSparseAttn:
    """A ``sparse_attn.prefill`` or ``.decode`` callable that pads heads / k to ``claim`` and trims back.

    prefill: q ``[T, H, 576]``, indices ``[T, K]``; decode: q ``[B, Q, H, 576]``, indices ``[B, Q, K]``.
    Output ``[..., H, d_v]`` bf16 and lse ``[..., H]`` fp32, exactly as the unpadded call's contract.
    Calls whose shapes are already claimed go straight through.
    """

    def __init__(self, fn: Callable[..., tuple[Tensor, Tensor]], method: str, claim: MethodClaim) -> None:
        if method not in PADDED_METHODS:
            raise ValueError(f"no padding rule for {method!r}")
        self.fn, self.method, self.claim = fn, method, claim
        self.__self__ = getattr(fn, "__self__", None)  # the backend's kernel object, as a bound method has
        self.__func__ = getattr(fn, "__func__", fn)

    def __call__(self, q: Tensor, kv: Tensor, indices: Tensor, sm_scale: float, *args, **kwargs):
        heads, k = q.shape[-2], indices.shape[-1]
        h_pad = _target(self.claim, "heads", heads, "head count", self.method)
        k_pad = _target(self.claim, "k", k, "k", self.method)
        if h_pad == heads and k_pad == k:
            return self.fn(q, kv, indices, sm_scale, *args, **kwargs)
        q_p = _pad_dim(q, q.dim() - 2, h_pad, 0.0)
        idx_p = _pad_dim(indices, indices.dim() - 1, k_pad, -1)
        out, lse = self.fn(q_p, kv, idx_p, sm_scale, *args, **kwargs)
        return out[..., :heads, :].contiguous(), lse[..., :heads].contiguous()

    def __repr__(self) -> str:
        return f"PaddedSparseAttn({self.method}, {self.fn!r})"
