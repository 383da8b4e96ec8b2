"""Which kernel family a profiled kernel belongs to (``bench/prefill_real_gpu.py``'s time split).

A kernel launched inside a family method of the resolved kernels (:func:`scoped` wraps each method in a
``torch.profiler.record_function`` range named ``dsa:<family>.<method>``) belongs to that family, whatever its
name: our Triton kernels are called ``_combine_kernel`` or ``_scan_kernel``, and a backend's torch glue runs
generic elementwise kernels. A kernel launched outside every family method (the model's own GEMMs, norms,
RoPE, residual adds) is classified by its name through :data:`NAME_TABLE`; a name no pattern matches counts
as ``other`` and is reported, so the table can be fixed.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections import Counter
from collections.abc import Callable, Iterable

import torch

SCOPE_PREFIX = "dsa:"
COLUMNS = ("indexer", "top-k", "sparse attention", "MoE", "dense GEMMs", "KV cache", "other")
# Kernel family (the scope's ``family`` part) -> column.
SCOPE_COLUMN = {"indexer": "indexer", "topk": "top-k", "sparse_attn": "sparse attention", "moe": "MoE",
                "kv_quant": "KV cache"}
# Kernels outside any family scope, first match wins: CUDA kernel names (cuBLAS / cuBLASLt / CUTLASS GEMMs,
# ATen's elementwise, reduction, copy and indexing kernels) and, for the CPU dry run, ATen op names.
# The family kernels' own names come first: a kernel the profiler tied to no op (Triton's and the peers' launchers
# can escape its launch tracking) is still put in its family's column by name.
NAME_TABLE: tuple[tuple[str, str], ...] = (
    (r"sparse_mla|_decode_kernel|_decode_pipe_kernel|fewhead|flash_fwd|flashmla|sparse_prefill", "sparse attention"),
    (r"_ragged_kernel|_paged_kernel|_head_sum|_rotate_quant|mqa_logits", "indexer"),
    (r"topk|_cand_|_split_hist|_split_final|_slice_kernel|_merge_kernel|_sample_kernel|_scan_kernel|_slots_kernel",
     "top-k"),
    (r"gemm_up|gemm_down|_route_kernel|_align_small|_quant_rows_kernel|_swiglu_quant|m_grouped", "MoE"),
    (r"_pack_fp8_kernel|_pack_bf16_kernel|_unpack_fp8_kernel|_index_k_kernel", "KV cache"),
    (r"gemm|gemv|nvjet|cutlass|xmma|aten::(mm|addmm|bmm|baddbmm|matmul|einsum|linear)$", "dense GEMMs"),
    (r"at::native|Memcpy|Memset|CatArray|indexSelect|elementwise|reduce_kernel|^aten::", "other"),
)
_NAME_PATTERNS = tuple((re.compile(p), c) for p, c in NAME_TABLE)


def column_of(name: str, scope: str | None) -> tuple[str, bool]:
    """The column of a kernel ``name`` launched inside family method ``scope`` (``"family.method"``, or None
    outside every family method), and whether the name was known (a scoped kernel always is)."""
    if scope is not None:
        return SCOPE_COLUMN.get(scope.split(".")[0], "other"), True
    for pattern, column in _NAME_PATTERNS:
        if pattern.search(name):
            return column, True
    return "other", False


def classify(items: Iterable[tuple[str, str | None, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """``(name, scope, us)`` per kernel -> microseconds per column (every column of :data:`COLUMNS`, zeros
    included) and the unknown names' microseconds (name -> us)."""
    totals = dict.fromkeys(COLUMNS, 0.0)
    unknown: dict[str, float] = {}
    for name, scope, us in items:
        column, known = column_of(name, scope)
        totals[column] += us
        if not known:
            unknown[name] = unknown.get(name, 0.0) + us
    return totals, unknown


def _scope(name: str, fn: Callable) -> Callable:
    @functools.wraps(fn)  # keeps the signature the model inspects (store_mla's scale_fmt, experts' out_dtype)
    def run(*args, **kwargs):
        with torch.profiler.record_function(name):
            return fn(*args, **kwargs)

    return run


def scoped(kernels):
    """A copy of resolved kernels whose every method runs inside a ``dsa:<family>.<method>`` profiler range
    (same backends, same bound methods inside)."""
    from dsa_runtime.families import FAMILY_METHODS
    from dsa_runtime.resolve import FamilyKernels

    families = {}
    for family, view in kernels.kernels.items():
        methods = {m: _scope(f"{SCOPE_PREFIX}{family}.{m}", getattr(view, m)) for m in FAMILY_METHODS[family]}
        families[family] = FamilyKernels(family, methods, view.backends)
    return dataclasses.replace(kernels, kernels=families)


def scope_of(event) -> str | None:
    """The innermost ``dsa:`` range around a profiler event (``"family.method"``), or None."""
    while event is not None:
        if event.name.startswith(SCOPE_PREFIX):
            return event.name[len(SCOPE_PREFIX):]
        event = event.cpu_parent
    return None


def profiled_items(prof, cuda: bool) -> tuple[list[tuple[str, str | None, float]], float]:
    """A finished profile as ``(name, scope, us)`` items and the microseconds of those the profiler tied to no op.

    CUDA: every kernel with the CPU op that launched it (its scope is that op's), then every other device event
    with no scope (classified by name). The device-side copies of the ``dsa:`` ranges are left out: they span
    their kernels and would count them twice. CPU (dry run): every op's self time.
    """
    from torch.autograd import DeviceType

    items: list[tuple[str, str | None, float]] = []
    device: list[tuple[str, float]] = []
    for event in prof.events():
        if event.device_type == DeviceType.CPU:
            if cuda:
                scope = scope_of(event) if event.kernels else None
                items += [(k.name, scope, float(k.duration)) for k in event.kernels]
            else:
                items.append((event.name, scope_of(event), float(event.self_cpu_time_total)))
        elif cuda and not event.name.startswith(SCOPE_PREFIX):
            device.append((event.name, float(event.time_range.elapsed_us())))
    unlinked = untied(device, [(name, us) for name, _, us in items]) if cuda else []
    return items + [(name, None, us) for name, us in unlinked], sum(us for _, us in unlinked)


def untied(device: list[tuple[str, float]], tied: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """The device events (``(name, us)``) left once the kernels tied to an op are taken out, one for one by name
    and duration (the profiler reports the same kernel in both lists)."""
    left = Counter((name, round(us, 3)) for name, us in tied)
    out = []
    for name, us in device:
        key = (name, round(us, 3))
        if left[key] > 0:
            left[key] -= 1
        else:
            out.append((name, us))
    return out
