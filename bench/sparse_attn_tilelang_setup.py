"""Inputs and the output check of bench/sparse_attn_tilelang.py, the sizes it runs at (one object, which
``--dry-run`` shrinks for the CPU) and the run's shared state (results so far, the step the watchdog times)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from dsa_runtime.testing.compare import out_and_lse
from dsa_runtime.testing.tolerances import tolerance

SCALE, PAGE = 0.135234, 64


@dataclass
class Sizes:
    """The GPU sizes; :meth:`shrink_for_cpu` (``--dry-run``: the reference standing in for the kernel) makes
    them tiny to check the script itself."""

    dev: str = "cuda"
    k: int = 2048
    t_pre: int = 4096
    s_pre: tuple[int, ...] = (8192, 32768)
    dec_batch: int = 64
    dec_ctx: int = 32768
    fp8_batches: list[int] = field(default_factory=lambda: [64, 128])  # fp8_656 decode timings (batch x dec_ctx)
    # (t, s, heads, k) of the prefill checks
    check_shapes: list[tuple[int, int, int, int]] = field(default_factory=lambda: [
        (3, 300, 64, 64), (3, 300, 128, 128), (512, 4096, 128, 2048), (512, 3000, 64, 2048)])
    # (batch, decode splits; None: the planned split) of the fp8_656 checks
    fp8_checks: list[tuple[int, int | None]] = field(default_factory=lambda: [(4, None), (64, 1)])

    def shrink_for_cpu(self) -> None:
        self.dev, self.t_pre, self.s_pre, self.dec_batch, self.dec_ctx, self.k = "cpu", 8, (512,), 2, 1024, 256
        self.check_shapes = [(3, 300, 64, 64), (5, 700, 128, 256)]
        self.fp8_batches = [2, 3]
        self.fp8_checks = [(4, None), (6, 1)]


SIZES = Sizes()
# A kernel that deadlocks (a wrong mbarrier phase) never returns: a watchdog ends the run with what it was doing.
PROGRESS = {"t": time.time(), "what": "start", "limit": 600.0}
RESULTS: dict = {"rows": [], "checks": {}}


def step(what: str, limit: float = 180.0) -> None:
    """Record what runs now; the watchdog exits (code 3) when one step takes longer than ``limit`` seconds."""
    PROGRESS.update(t=time.time(), what=what, limit=limit)


def poison_allocator(nbytes: int) -> None:
    """Leave NaN in freed blocks of the caching allocator, so outputs the kernel does not write show up."""
    if SIZES.dev == "cuda":
        blob = torch.full((nbytes // 4,), float("nan"), device=SIZES.dev)
        del blob


def prefill_case(gen: torch.Generator, t: int, s: int, heads: int, k: int):
    """Random q/kv, distinct indices with ragged -1 padding, one all -1 row, a duplicated index; unselected KV
    rows (always row 0 and the last) are NaN."""
    q = torch.randn(t, heads, 576, device=SIZES.dev, generator=gen).bfloat16()
    kv = torch.randn(s, 576, device=SIZES.dev, generator=gen).bfloat16()
    pool = s - 2  # rows 1 .. s-2 may be selected
    idx = torch.rand(t, pool, device=SIZES.dev, generator=gen).argsort(dim=1)[:, :k].to(torch.int32) + 1
    if t > 1:
        idx[1, k // 3:] = -1  # ragged: a short context
        idx[0, :] = -1  # an empty query: zeros and lse +inf
    if t > 2:
        idx[2, 1] = idx[2, 0]  # a duplicate: counts twice
    idx[3::5, ::7] = -1
    used = torch.zeros(s, dtype=torch.bool, device=SIZES.dev)
    used[idx[idx >= 0].long()] = True
    kv[~used] = float("nan")
    return q, kv, idx


def check(name: str, got, want) -> bool:
    out, lse = got
    msg = out_and_lse(out.float(), lse, want[0].float(), want[1], tolerance("sparse_attn.out"),
                      tolerance("sparse_attn.lse"))
    empty = torch.isposinf(want[1])
    if msg is None and bool(empty.any()) and bool((out[empty] != 0).any()):
        msg = "a query with no valid index has a non-zero output"
    if msg is None and not bool(torch.isfinite(out).all()):
        msg = "non-finite output"
    err = (out.float() - want[0].float()).abs().max().item()
    fin = torch.isfinite(want[1])
    lerr = (lse[fin] - want[1][fin]).abs().max().item() if bool(fin.any()) else 0.0
    print(f"  {'PASS' if msg is None else 'FAIL'} {name:54s} max|out err| {err:.3e}  max|lse err| {lerr:.3e}"
          + ("" if msg is None else f"  {msg}"), flush=True)
    return msg is None


def fp8_check_case(gen: torch.Generator, batch: int, heads: int = 128):
    """An ``fp8_656`` paged cache (page 64) whose selected rows pack random c / k_pe with power-of-two scales and
    whose other rows (page 0 always among them) are garbage bytes with an e4m3 NaN in every 128-block; per
    request k distinct slots, request 0 cut to 100 (-1 after), request 1 all -1 (an empty query)."""
    from dsa_runtime.testing.fp8util import pack_mla_656, random_bytes

    pages = batch * 8 + 1
    slots = torch.rand(batch, (pages - 1) * PAGE, device=SIZES.dev, generator=gen).argsort(dim=1)[:, :SIZES.k] + PAGE
    slots = slots.to(torch.int32).view(batch, 1, SIZES.k)
    slots[0, 0, 100:] = -1
    slots[1, 0, :] = -1
    used = torch.unique(slots[slots >= 0].long())
    cache = random_bytes(gen, (pages * PAGE, 656), torch.device(SIZES.dev))
    cache[:, 0:512:61] = 0x7F  # e4m3 NaN
    c = torch.randn(used.numel(), 512, device=SIZES.dev, generator=gen)
    k_pe = torch.randn(used.numel(), 64, device=SIZES.dev, generator=gen).bfloat16()
    cache[used] = pack_mla_656(c, k_pe, "ue8m0")
    q = torch.randn(batch, 1, heads, 576, device=SIZES.dev, generator=gen).bfloat16()
    return q, cache.view(pages, PAGE, 656), slots


def fp8_timing_cache(gen: torch.Generator, rows: int) -> torch.Tensor:
    """``[rows // 64, 64, 656]`` rows of random finite e4m3 c, power-of-two scales, random bf16 k_pe."""
    cache = torch.randint(0, 256, (rows, 656), dtype=torch.uint8, device=SIZES.dev, generator=gen)
    c = cache[:, :512]
    c[(c & 0x7F) == 0x7F] = 0x3C  # no e4m3 NaN
    exps = torch.randint(-8, 1, (rows, 4), device=SIZES.dev, generator=gen).float()
    cache[:, 512:528] = torch.exp2(exps).contiguous().view(torch.uint8)
    cache[:, 528:] = torch.randn(rows, 64, device=SIZES.dev, generator=gen).bfloat16().view(torch.uint8)
    return cache.view(-1, PAGE, 656)


def prefill_inputs(gen: torch.Generator, s: int):
    q = torch.randn(SIZES.t_pre, 128, 576, device=SIZES.dev, generator=gen).bfloat16()
    kv = torch.randn(s, 576, device=SIZES.dev, generator=gen).bfloat16()
    idx = torch.rand(SIZES.t_pre, s, device=SIZES.dev, generator=gen).argsort(dim=1)[:, :SIZES.k].to(torch.int32)
    return q, kv, idx
