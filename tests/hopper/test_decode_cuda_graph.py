"""Decode without host synchronisation: the ``triton`` backend's decode-path calls captured in a CUDA graph.

Each call (MLA store in both layouts, index-K store, paged indexer logits, fused top-k + page-table transform,
sparse decode over bf16 and ``fp8_656`` caches) is resolved to ``triton``, warmed up, captured in a
``torch.cuda.CUDAGraph`` on static inputs, then NEW data (other context lengths, page tables, slots, ``-1``
entries) is copied into those inputs and the graph replayed: the result must equal an eager call of the
reference backend on the new data (kit checkers and tolerances). A ``.item()`` or a data-dependent allocation
fails the capture; work sized from the capture-time data fails the comparison. A family whose Triton kernel
is not registered yet is skipped with that reason. The CPU test below runs the same harness with an eager
"graph" so that the builders and checks are proven on every CI run, and shows that stale replays fail.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from dsa_runtime.plugin_manager import get_manager
from dsa_runtime.resolve import KernelConfig, resolve_kernels
from dsa_runtime.testing.case import CheckContext, clone
from tests.hopper.gpu_marks import NEEDS_SM90, cuda_graph_capture
from tests.hopper.graph_steps import Shape, Step, steps

V32 = Shape()  # batch 4, contexts up to 4096, k 2048, 128 heads, 64 index heads, page 64
SMALL = Shape(batch=3, max_len=256, k=64, heads=16, index_heads=64)


def _bound(backend: str, step: Step, device: str) -> Callable[..., object]:
    """``step``'s method resolved to ``backend`` (head / k padding included where its claim needs it)."""
    resolved = resolve_kernels(
        KernelConfig(platform="cuda_hopper" if device == "cuda" else "cpu", device=device, kv_layout=step.layout,
                     methods={step.method: backend}),
        needs=step.needs,
    )
    family, name = step.method.split(".")
    return getattr(getattr(resolved, family), name)


def _copy_into(static: dict, new: dict) -> None:
    for key, value in new.items():
        if isinstance(value, torch.Tensor):
            assert static[key].shape == value.shape and static[key].dtype == value.dtype, key
            static[key].copy_(value)


def run_step(step: Step, fn: Callable[..., object], oracle: Callable[..., object], device: torch.device,
             capture: Callable[[Callable[[], object]], tuple[object, Callable[[], None]]]) -> list[str]:
    """Capture ``step`` on seed-1 inputs, replay on two new input sets; the checker's messages (empty: pass)."""
    static = step.build(torch.Generator(device=device).manual_seed(1), device)
    result, replay = capture(lambda: step.run(fn, static))
    problems = []
    for seed in (2, 3):
        new = step.build(torch.Generator(device=device).manual_seed(seed), device)
        _copy_into(static, new)
        replay()
        want = step.run(oracle, clone(new))
        ctx = CheckContext(step.case, new, result, want, getattr(fn, "__self__", None),  # type: ignore[arg-type]
                           getattr(oracle, "__self__", None), device, device)
        if msg := step.check(ctx):
            problems.append(f"{step.name} (replay on seed {seed}): {msg}")
    return problems


@pytest.mark.gpu
@NEEDS_SM90
@pytest.mark.parametrize("step", steps(V32), ids=lambda s: s.name)
def test_triton_decode_path_replays_a_cuda_graph_on_new_data(step):
    backend = get_manager().get_backend("triton")
    family = step.method.split(".")[0]
    if family not in backend.kernels:
        pytest.skip(f"the triton backend has no {family} kernel registered yet")
    ok, why = backend.available()
    assert ok, why
    fn = _bound("triton", step, "cuda")  # ConfigError (a failure) when triton refuses these V3.2 shapes
    oracle = _bound("reference", step, "cuda")
    problems = run_step(step, fn, oracle, torch.device("cuda"), cuda_graph_capture)
    assert not problems, "\n".join(problems)


# Per-rank heads under TP 8 / 4: the few-head decode kernel (fold / cols at 16 heads, cols / one at 32).
FEW_HEAD_STEPS = [s for h in (16, 32) for s in steps(Shape(heads=h)) if s.method == "sparse_attn.decode"]


@pytest.mark.gpu
@NEEDS_SM90
@pytest.mark.parametrize("step", FEW_HEAD_STEPS, ids=lambda s: f"{s.name}-h{s.needs['heads']}")
def test_triton_few_head_decode_replays_a_cuda_graph_on_new_data(step):
    fn = _bound("triton", step, "cuda")
    oracle = _bound("reference", step, "cuda")
    problems = run_step(step, fn, oracle, torch.device("cuda"), cuda_graph_capture)
    assert not problems, "\n".join(problems)


@pytest.mark.gpu
@NEEDS_SM90
@pytest.mark.parametrize("step", [s for s in FEW_HEAD_STEPS if s.needs["heads"] == 16], ids=lambda s: s.name)
def test_few_head_decode_merged_in_the_launch_replays_a_cuda_graph(step):
    # The in-launch merge's ticket counters must be zero again after every replay, or the next one never merges.
    from dsa_runtime.plugins.cuda_hopper.triton.fewhead_plan import FewHeadConfig
    from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_decode_fewhead import decode_fewhead

    cfg = FewHeadConfig(variant="fold", fused=True)

    def fused(q, kv_cache, indices, sm_scale, *, layout, d_v=512):
        return decode_fewhead(q, kv_cache, indices, sm_scale, d_v, layout=layout, config=cfg)

    problems = run_step(step, fused, _bound("reference", step, "cuda"), torch.device("cuda"), cuda_graph_capture)
    assert not problems, "\n".join(problems)


def eager_capture(call: Callable[[], object]) -> tuple[object, Callable[[], None]]:
    """The CPU stand-in for a graph: the replay calls the kernel again and copies into the first result."""
    result = call()

    def replay() -> None:
        again = call()
        for mine, new in zip(result if isinstance(result, tuple) else (result,),
                             again if isinstance(again, tuple) else (again,), strict=True):
            if mine is not new:
                mine.copy_(new)

    return result, replay


def stale_capture(call: Callable[[], object]) -> tuple[object, Callable[[], None]]:
    """A kernel that did its work from the capture-time data: the replay changes nothing."""
    return call(), lambda: None


@pytest.mark.parametrize("step", steps(SMALL), ids=lambda s: s.name)
def test_harness_on_cpu_passes_fresh_replays_and_catches_stale_ones(step):
    fn = _bound("reference", step, "cpu")
    oracle = _bound("reference", step, "cpu")
    cpu = torch.device("cpu")
    assert run_step(step, fn, oracle, cpu, eager_capture) == []
    stale = run_step(step, fn, oracle, cpu, stale_capture)
    assert len(stale) == 2, f"{step.name}: a stale replay went unnoticed"
