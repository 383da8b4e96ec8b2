"""Static check of the ``setmaxnreg`` calls in TileLang-generated CUDA source (no GPU, no compiler needed).

``setmaxnreg`` (``tl::warpgroup_reg_alloc<N>`` = ``.inc``, ``tl::warpgroup_reg_dealloc<N>`` = ``.dec``) moves
registers between a warpgroup and the CTA's pool. The PTX contract it must keep, and which a mistake breaks only
at run time (an illegal instruction or a hang), is checked here on the generated source:

* ``N`` is a multiple of 8 in ``[24, 256]``;
* every warp of a warpgroup executes the same instruction: the call sits only under ``threadIdx.x`` range
  conditions whose bounds are multiples of 128 (not in a loop, not under a data-dependent condition);
* at most one call per warpgroup (this kernel family never re-adjusts);
* ``.inc`` asks for at least and ``.dec`` for at most the launch count: the registers every thread starts with,
  which ptxas sets from ``__launch_bounds__(threads, 1)`` to ``65536 / threads`` rounded down to 8 (168 at 384
  threads, 128 at 512) when the kernel uses ``setmaxnreg`` (pass ptxas' own count as ``launch_regs`` when known);
* the warpgroups' counts together fit in the pool the launch allocated: ``sum(count) * 128 <= launch * threads``.

The PTX ISA's ``setmaxnreg`` section makes the direction a precondition: with ``.inc`` the warp's register count
before the instruction must be at most the operand, with ``.dec`` at least; otherwise the behaviour is undefined.
The ws schedule's first version asked ``inc 160`` in a warpgroup that held 168: an illegal instruction on an H200.
"""

from __future__ import annotations

import re

_CALL = re.compile(r"tl::warpgroup_reg_(alloc|dealloc)<(\d+)>\(\)")
_LT = re.compile(r"^if \(+\(int\)threadIdx\.x\)+ < (\d+)\)+ \{$")
_GE = re.compile(r"^if \(+(\d+) <= \(+int\)threadIdx\.x\)+ \{$")
WARPGROUP = 128


def launch_threads(src: str) -> int | None:
    """Threads per block from the kernel's ``__launch_bounds__`` (``None`` when it has none)."""
    found = re.search(r"__launch_bounds__\((\d+)", src)
    return int(found.group(1)) if found else None


def default_launch_regs(threads: int) -> int:
    """The per-thread registers ptxas gives a ``setmaxnreg`` kernel launched with ``threads`` (one block per SM)."""
    return min(65536 // threads // 8 * 8, 256)


def _calls(src: str, threads: int) -> tuple[list[tuple[str, int, int, int]], list[str]]:
    """Each call as (kind, count, lo, hi): the thread range that reaches it; problems of placement."""
    problems: list[str] = []
    # A frame per open brace: (lo, hi, whole, range_test); whole is False in a loop or under a data condition.
    stack: list[tuple[int, int, bool, bool]] = [(0, threads, True, False)]
    calls = []
    for raw in src.splitlines():
        line = raw.strip()
        for kind, count in _CALL.findall(line):
            lo, hi, whole, _ = stack[-1]
            calls.append((kind, int(count), lo, hi))
            if not whole:
                problems.append(f"setmaxnreg {kind}<{count}> sits in a loop or under a data-dependent condition")
        if line == "} else {" and len(stack) > 1:
            lo, hi, _, range_test = stack.pop()
            plo, phi, pwhole, _ = stack[-1]
            # The else of a range test is the parent range minus the tested one (exact when that is a prefix
            # or a suffix of it, the only forms TileLang emits); any other else is not a warpgroup range.
            if range_test and lo == plo:
                stack.append((hi, phi, pwhole, False))
            elif range_test and hi == phi:
                stack.append((plo, lo, pwhole, False))
            else:
                stack.append((plo, phi, False, False))
            continue
        opens, closes = line.count("{"), line.count("}")
        if opens == closes + 1 and line.endswith("{"):
            plo, phi, pwhole, _ = stack[-1]
            lt, ge = _LT.match(line), _GE.match(line)
            if lt:
                stack.append((plo, min(phi, int(lt.group(1))), pwhole, True))
            elif ge:
                stack.append((max(plo, int(ge.group(1))), phi, pwhole, True))
            elif line.startswith(("if", "for", "while", "}", "do", "else")):
                stack.append((plo, phi, False, False))
            else:
                stack.append((plo, phi, pwhole, False))  # a plain scope block
            continue
        for _ in range(closes - opens):
            if len(stack) > 1:
                stack.pop()
    return calls, problems


def setmaxnreg_problems(src: str, launch_regs: int | None = None) -> list[str]:
    """What breaks the ``setmaxnreg`` contract in ``src`` (empty when nothing does, or it has no ``setmaxnreg``)."""
    if not _CALL.search(src) and "setmaxnreg" not in src:
        return []
    threads = launch_threads(src)
    if threads is None:
        return ["setmaxnreg in a kernel without __launch_bounds__ (ptxas ignores it or the pool is unknown)"]
    launch = launch_regs or default_launch_regs(threads)
    calls, problems = _calls(src, threads)
    if "setmaxnreg" in src and not calls:
        problems.append("setmaxnreg in a form this check does not read (inline asm?)")
    per_wg: dict[int, int] = {}
    for kind, count, lo, hi in calls:
        what = f"setmaxnreg {'inc' if kind == 'alloc' else 'dec'} {count} (threads {lo}-{hi - 1})"
        if count % 8 or not 24 <= count <= 256:
            problems.append(f"{what}: the count must be a multiple of 8 in [24, 256]")
        if lo % WARPGROUP or hi % WARPGROUP or lo >= hi:
            problems.append(f"{what}: not executed by whole warpgroups")
            continue
        if kind == "alloc" and count < launch:
            problems.append(f"{what}: inc below the launch count {launch} (illegal instruction)")
        if kind == "dealloc" and count > launch:
            problems.append(f"{what}: dec above the launch count {launch}")
        for wg in range(lo // WARPGROUP, hi // WARPGROUP):
            if wg in per_wg:
                problems.append(f"{what}: warpgroup {wg} executes more than one setmaxnreg")
            per_wg[wg] = count
    total = sum(per_wg.get(wg, launch) for wg in range(-(-threads // WARPGROUP))) * WARPGROUP
    if total > launch * threads:
        problems.append(f"setmaxnreg counts need {total} registers, the launch pool holds {launch * threads} "
                        "(setmaxnreg.inc would wait forever)")
    return problems
