"""Comparison helpers: each returns ``None`` when the check holds, else a message saying what differed.

Messages name the compared quantity, how many elements are off, the worst error with its index and values,
and the first bad row, so that a vendor can find the problem without rerunning under a debugger.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from dsa_runtime.testing.tolerances import Tolerance


def unravel(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    """Flat index -> index tuple for ``shape`` (row-major)."""
    out = []
    for dim in reversed(shape):
        out.append(flat % dim if dim else 0)
        flat = flat // dim if dim else 0
    return tuple(reversed(out))


def expect_tensor(
    name: str, t: object, shape: Sequence[int] | None, dtype: torch.dtype | tuple[torch.dtype, ...] | None
) -> str | None:
    """Type, shape and dtype check of a kernel output."""
    if not isinstance(t, Tensor):
        return f"{name}: expected a tensor, got {type(t).__name__}"
    if shape is not None and tuple(t.shape) != tuple(shape):
        return f"{name}: shape {tuple(t.shape)}, expected {tuple(shape)}"
    dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
    if dtype is not None and t.dtype not in dtypes:
        names = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        return f"{name}: dtype {str(t.dtype).replace('torch.', '')}, expected {names}"
    return None


def _fmt(v: float) -> str:
    return f"{v:.6g}"


def close(name: str, got: Tensor, want: Tensor, tol: Tolerance, *, row_dims: int = 1) -> str | None:
    """Elementwise ``|got - want| <= atol + rtol |want| + row_atol * rowscale``; non-finite ``want`` exact.

    Args:
        row_dims: number of trailing dims forming a "row" (the unit of ``rowscale`` and of "first bad row").
    """
    g, w = got.detach().float(), want.detach().float().to(got.device)
    if g.shape != w.shape:
        return f"{name}: shape {tuple(g.shape)}, expected {tuple(w.shape)}"
    if g.numel() == 0:
        return None
    if bool(torch.isnan(w).any()):  # never a valid expected value: the oracle itself went wrong
        at = unravel(int(torch.nonzero(torch.isnan(w).reshape(-1))[0]), w.shape)
        return (
            f"{name}: the reference produced {int(torch.isnan(w).sum())} NaN values (first at {at}); "
            "the oracle is wrong for this case, so nothing can be judged"
        )
    finite = torch.isfinite(w)
    # Non-finite reference entries (-inf outside a window, +inf lse of an empty query) must match exactly.
    special_bad = ~finite & (g != w)
    err = torch.where(finite, (g - w).abs(), torch.zeros_like(g))
    err = torch.where(finite & ~torch.isfinite(g), torch.full_like(g, float("inf")), err)
    bound = tol.atol + tol.rtol * w.abs().where(finite, torch.zeros_like(w))
    if tol.row_atol:
        lead = g.shape[: g.dim() - row_dims]
        rows = w.abs().where(finite, torch.zeros_like(w)).reshape(*lead, -1)
        scale = rows.amax(dim=-1) if rows.shape[-1] else torch.zeros(lead, dtype=w.dtype, device=w.device)
        bound = bound + tol.row_atol * scale.reshape(*lead, *([1] * row_dims))
    if bool(special_bad.any()):
        at = unravel(int(torch.nonzero(special_bad.reshape(-1))[0]), g.shape)
        return (
            f"{name}: {int(special_bad.sum())} of {g.numel()} elements should be {_fmt(float(w[at]))} but are not; "
            f"first at {at} (got {_fmt(float(g[at]))})"
        )
    bad = finite & ~(err <= bound)
    n_bad = int(bad.sum())
    if n_bad == 0:
        return None
    flat_bad = bad.reshape(-1)
    first = int(torch.nonzero(flat_bad)[0])
    excess = torch.where(bad, (err - bound).nan_to_num(float("inf")), torch.zeros_like(err)).reshape(-1)
    worst = int(torch.argmax(excess))
    wi, fi = unravel(worst, g.shape), unravel(first, g.shape)
    lead_n = max(0, g.dim() - row_dims)
    gf, wf = g.reshape(-1), w.reshape(-1)
    return (
        f"{name}: {n_bad} of {g.numel()} elements out of tolerance "
        f"(rtol={tol.rtol:g}, atol={tol.atol:g}{f', row_atol={tol.row_atol:g}' if tol.row_atol else ''}); "
        f"max error {_fmt(float(err.reshape(-1)[worst]))} at {wi} (got {_fmt(float(gf[worst]))}, "
        f"want {_fmt(float(wf[worst]))}); first bad row {fi[:lead_n] or fi} "
        f"(got {_fmt(float(gf[first]))}, want {_fmt(float(wf[first]))} at {fi})"
    )


def rel_l2(name: str, got: Tensor, want: Tensor, tol: Tolerance) -> str | None:
    """Per-row ``||got - want|| / ||want||`` (rows = all but the last dim) against ``tol.rel_l2``."""
    assert tol.rel_l2 is not None
    g = got.detach().float().reshape(-1, got.shape[-1])
    w = want.detach().float().to(got.device).reshape(-1, want.shape[-1])
    if g.shape != w.shape:
        return f"{name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if g.numel() == 0:
        return None
    num = (g - w).norm(dim=-1)
    den = w.norm(dim=-1)
    # A zero reference row must come back (near) zero: judge it against the case's typical row norm.
    floor = den[den > 0].median() if bool((den > 0).any()) else torch.tensor(1.0, dtype=den.dtype)
    ratio = num / torch.maximum(den, 1e-3 * floor)
    ratio = torch.where(torch.isfinite(ratio), ratio, torch.full_like(ratio, float("inf")))
    bad = ratio > tol.rel_l2
    if not bool(bad.any()):
        return None
    worst = int(torch.argmax(ratio))
    first = int(torch.nonzero(bad)[0])
    lead = tuple(got.shape[:-1])
    col = int(torch.argmax((g[worst] - w[worst]).abs().nan_to_num(float("inf"))))
    return (
        f"{name}: {int(bad.sum())} of {g.shape[0]} rows over relative L2 error {tol.rel_l2:g}; "
        f"worst row {unravel(worst, lead)} error {_fmt(float(ratio[worst]))} (largest diff at column {col}: "
        f"got {_fmt(float(g[worst, col]))}, want {_fmt(float(w[worst, col]))}); first bad row {unravel(first, lead)}"
    )


def equal(name: str, got: Tensor, want: Tensor, *, what: str = "elements") -> str | None:
    """Exact equality (integers, bytes; floats compared by bits via the caller)."""
    if tuple(got.shape) != tuple(want.shape):
        return f"{name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    diff = got != want.to(got.device)
    n_bad = int(diff.sum())
    if n_bad == 0:
        return None
    first = unravel(int(torch.nonzero(diff.reshape(-1))[0]), got.shape)
    return (
        f"{name}: {n_bad} of {got.numel()} {what} differ; first at {first} "
        f"(got {got[first].item()}, want {want[first].item()})"
    )


def same_bytes(name: str, got: Tensor, want: Tensor) -> str | None:
    """Bitwise equality of two tensors of the same dtype (NaN payloads included)."""
    if got.dtype != want.dtype:
        return f"{name}: dtype {got.dtype}, expected {want.dtype}"
    return equal(name, as_bytes(got), as_bytes(want.to(got.device)), what="bytes")


def as_bytes(t: Tensor) -> Tensor:
    """View a tensor as uint8 along its last dim (``[..., n * itemsize]``)."""
    t = t.contiguous()
    if t.dtype == torch.uint8:
        return t
    if t.dim() == 0:
        t = t.reshape(1)
    return t.view(torch.uint8)


LN2_INV = 1.0 / 0.6931471805599453  # lse / expected for a base-2 lse: 1.4427


def lse_ratio_hint(got: Tensor, want: Tensor) -> str:
    """``"; lse / expected = 1.4427: base-2 log?"`` when ``got / want`` is one constant over the finite entries
    (relative spread under 1e-3 on entries with ``|want| > 0.5``), ``""`` otherwise."""
    g, w = got.detach().float(), want.detach().float().to(got.device)
    use = torch.isfinite(w) & torch.isfinite(g) & (w.abs() > 0.5)
    if int(use.sum()) < 4:
        return ""
    r = g[use] / w[use]
    mid = float(r.median())
    if not abs(mid) > 0 or float(((r - mid).abs() / abs(mid)).max()) > 1e-3 or abs(mid - 1.0) < 1e-3:
        return ""
    name = ": base-2 log?" if abs(mid - LN2_INV) < 1e-3 else (": log10?" if abs(mid - 0.4342945) < 1e-3 else "")
    return f"; lse / expected = {mid:.4f}{name}"


def out_and_lse(out: Tensor, lse: Tensor, want_out: Tensor, want_lse: Tensor, out_tol: Tolerance, lse_tol: Tolerance) -> str | None:
    """Attention results: one message naming every part that differs (``out`` and ``lse``), with a hint
    when ``lse`` is off by a constant factor (a base-2 lse is ``1.4427`` times the natural one)."""
    out_msg = close("out", out, want_out, out_tol, row_dims=2)
    lse_msg = close("lse", lse, want_lse, lse_tol, row_dims=1)
    if lse_msg:
        lse_msg += lse_ratio_hint(lse, want_lse)
    parts = [m for m in (out_msg, lse_msg) if m]
    if len(parts) == 2:
        return f"out and lse both differ: {parts[0]} | {parts[1]}"
    return parts[0] if parts else None
