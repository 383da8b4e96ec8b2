"""Chunked prefill of one long prompt at DeepSeek-V3.2's real dimensions on one GPU, through the runtime's own
step path, with our kernels and with the stack SGLang runs on Hopper (FlashMLA sparse prefill, DeepGEMM
indexer logits, DeepGEMM MoE) on the same weights: tokens/s, ms per chunk and layer by kernel family, the
compute roofline of the same run and peak memory.

    python bench/prefill_real_gpu.py [--layers 4] [--prompts 8192,32768,131072] [--chunk-sizes 8192,16384]
        [--peer | --no-peer] [--kv-layout fp8_656] [--headroom-gib 4] [--budget-s 420] [--json PATH]
    python bench/prefill_real_gpu.py --dry-run    # tiny V3.2 preset on the CPU: checks this script only

Model (``decode_real_setup.real_config``): V3.2's dimensions cut to ``--layers`` layers (the first
``--dense-layers`` dense), random FP8 weights with the released checkpoint's names, dtypes and ue8m0 block
scales, loaded by the runtime's loader (experts stay FP8, the other linears are dequantised to bf16 at load).
One slot's KV cache covers the longest prompt (``--headroom-gib`` kept free beside it; a prompt whose cache
does not fit is reported as such).

Backend sets, one model (``runner.kernels`` swapped between them), each resolved as
``dsa-runtime plugins --resolve --set KEY=VALUE ...`` resolves its settings:

* ``ours``: ``sparse_attn_prefill`` the first available of tilelang / triton, ``indexer`` and ``moe`` triton
  (pinned: ``auto`` would take FlashMLA and DeepGEMM where they are installed); on the CPU plain ``auto``.
* ``peer``: ``sparse_attn_prefill=flashmla_sparse``, ``indexer=deepgemm``, ``moe=deepgemm``, each only where
  its backend is available (the rest stays ours and the set says which are missing); with none available
  the set is "not installed" and does not run. Top-k and the KV-cache kernels are ours in both.

Per case (prompt length N, chunk size C, backend set), in the order chunk size, prompt, set: a warm-up once per set
and chunk size (every chunk of the longest prompt: compiles and autotunes outside the timings; some kernels choose
their configuration by the context length, so a middle chunk can compile too), then the prompt's ``ceil(N / C)``
chunks, each one ``Step`` of the slot's rows at consecutive positions (the ragged prefill kernels; only the last
chunk returns its last row's logits, as the engine runs a prefill), synchronised one by one: wall ms per chunk (host
work included) and the peak of ``torch.cuda.max_memory_allocated`` (reset per chunk; ``transient`` = peak -
allocated before the chunk). Then the last chunk (the longest context) runs again under torch.profiler; its kernels
are split by family (``kernel_families``: the resolved methods' scopes, the model's own kernels by name) and
reported in ms per layer. Roofline: the chunks' matmul FLOPs (``prefill_flops``) at the bf16 ``torch.mm`` and FP8
``torch._scaled_mm`` rates measured at 8192^3 in this run; ``% roofline`` = roofline / wall.

Time: every case is estimated before it starts (its roofline times the largest wall / roofline its set has
measured, 4x before the first) and skipped, with the reason, when it would end past ``--budget-s`` counted
from the start. The table prints last; JSON goes to ``--json`` after every case.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode_real_setup as S  # noqa: E402
from common import write_json  # noqa: E402
from decode_real_gpu import build_runner, log, sync  # noqa: E402
from kernel_families import SCOPE_PREFIX, classify, profiled_items, scoped  # noqa: E402
from prefill_report import (  # noqa: E402
    COMPILE_ALLOWANCE_S,
    FIRST_WALL_OVER_ROOFLINE,
    case_roofline,
    print_plan,
    print_table,
)

RESULTS = Path(__file__).resolve().parent / "results"
# Backend settings (``--set KEY=VALUE``) of each set: ours, the first available backend of each list; the peer
# stack, one backend per key.
OURS = {"sparse_attn_prefill": ("tilelang", "triton"), "indexer": ("triton",), "moe": ("triton",)}
PEER = {"sparse_attn_prefill": "flashmla_sparse", "indexer": "deepgemm", "moe": "deepgemm"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (default 4: 1 dense + 3 MoE, ~40 GB)")
    ap.add_argument("--dense-layers", type=int, default=1, help="leading dense layers (first_k_dense_replace)")
    ap.add_argument("--prompts", default=None, help="prompt lengths in tokens (default 8192,32768,131072)")
    ap.add_argument("--chunk-sizes", default=None,
                    help="tokens per prefill chunk, as --chunked-prefill-size (default 8192,16384)")
    ap.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the peer stack (FlashMLA + DeepGEMM) where installed (default on)")
    ap.add_argument("--kv-layout", default="fp8_656", choices=("fp8_656", "bf16"))
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--expert-pool", type=int, default=8,
                    help="distinct random experts drawn per layer (the model still holds all 256 apart)")
    ap.add_argument("--headroom-gib", type=float, default=4.0, help="GPU memory kept free beside weights and cache")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="seconds from the start; a case whose estimate ends past it is skipped (said so)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="default bench/results/prefill_real_gpu.json (_dry with --dry-run)")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny V3.2 preset on the CPU (default prompts 48,100, chunk sizes 40,64): checks the script")
    args = ap.parse_args(argv)
    args.prompts = args.prompts or ("48,100" if args.dry_run else "8192,32768,131072")
    args.chunk_sizes = args.chunk_sizes or ("40,64" if args.dry_run else "8192,16384")
    try:
        args.prompt_list = sorted({int(x) for x in args.prompts.split(",")})
        args.chunk_list = sorted({int(x) for x in args.chunk_sizes.split(",")})
    except ValueError:
        ap.error("--prompts and --chunk-sizes take comma-separated integers")
    if min(args.prompt_list) < 2 or min(args.chunk_list) < 2:
        ap.error("prompts and chunk sizes need at least 2 tokens (a 1-token run is a decode row)")
    if not 0 <= args.dense_layers <= args.layers or args.layers < 1:
        ap.error(f"need 1 <= layers and 0 <= dense layers <= layers, got {args.dense_layers} of {args.layers}")
    if args.json is None:
        args.json = str(RESULTS / ("prefill_real_gpu_dry.json" if args.dry_run else "prefill_real_gpu.json"))
    return args


# --- backend sets -----------------------------------------------------------------------------------------------
@dataclass
class BackendSet:
    """One column of the comparison: its ``--set KEY=VALUE`` settings, the peer backends it lacks (with why),
    and after resolution its kernels (None: it does not run; ``status`` says why)."""

    name: str
    settings: list[str]
    missing: list[str] = field(default_factory=list)
    status: str = "ready"
    kernels: Any = None

    def describe(self) -> dict:
        backends = {m: c.backend for m, c in self.kernels.choices.items()} if self.kernels is not None else {}
        return {"name": self.name, "settings": self.settings, "missing": self.missing, "status": self.status,
                "kernels": backends}


def backend_sets(available, peer: bool) -> list[BackendSet]:
    """``ours`` and, with ``peer``, the peer stack, from ``available(backend) -> (ok, why)`` (see the module
    docstring); a peer with no backend available is ``not installed``."""
    ours = []
    for key, names in OURS.items():
        name = next((n for n in names if available(n)[0]), None)
        if name is not None:
            ours.append(f"{key}={name}")
    sets = [BackendSet("ours", ours)]
    if peer:
        settings, missing = [], []
        for key, name in PEER.items():
            ok, why = available(name)
            (settings if ok else missing).append(f"{key}={name}" if ok else f"{key}={name}: {why}")
        sets.append(BackendSet("peer", settings, missing, "ready" if settings else "not installed"))
    return sets


def resolve_set(bset: BackendSet, config, args: argparse.Namespace) -> None:
    """Resolve ``bset``'s settings for this model (``kernel_needs``); a ConfigError becomes its status."""
    from dsa_runtime.cli.plugins_cmd import parse_settings
    from dsa_runtime.errors import ConfigError
    from dsa_runtime.model.runner import kernel_needs
    from dsa_runtime.resolve import KernelConfig, resolve_kernels

    try:
        kcfg = KernelConfig(platform="cpu" if args.dry_run else "auto", kv_layout=args.kv_layout,
                            **parse_settings(bset.settings))
        bset.kernels = resolve_kernels(kcfg, needs=kernel_needs(config, args.page_size))
    except ConfigError as exc:
        bset.status = f"resolution failed: {exc}"


def _available(manager, name: str) -> tuple[bool, str]:
    backend = manager.backends.get(name)
    return backend.available() if backend is not None else (False, f"no {name!r} backend registered")


# --- rates, plan, budget ----------------------------------------------------------------------------------------
def matmul_rates(device: torch.device) -> dict[str, object]:
    """bf16 and FP8 matmul TFLOP/s at 8192^3 (``common``); on the CPU, bf16 ``torch.mm`` at 256^3 for both."""
    if device.type == "cuda":
        from common import bf16_matmul_ceiling_tflops, fp8_matmul_ceiling_tflops

        rates = {"bf16_tflops": bf16_matmul_ceiling_tflops(), "fp8_tflops": fp8_matmul_ceiling_tflops(),
                 "how": "torch.mm bf16 and torch._scaled_mm e4m3 at 8192^3"}
        torch.cuda.empty_cache()
        return rates
    a = torch.randn(256, 256, dtype=torch.bfloat16)
    a @ a
    t0 = time.perf_counter()
    for _ in range(5):
        a @ a
    tflops = 5 * 2 * 256**3 / (time.perf_counter() - t0) / 1e12
    return {"bf16_tflops": tflops, "fp8_tflops": tflops, "how": "CPU: bf16 torch.mm at 256^3 for both"}


@dataclass
class Budget:
    """Seconds left of ``--budget-s`` and each set's largest measured wall / roofline."""

    limit_s: float
    t0: float = field(default_factory=time.perf_counter)
    ratio: dict[str, float] = field(default_factory=dict)

    def left(self) -> float:
        return self.limit_s - (time.perf_counter() - self.t0)

    def estimate(self, name: str, roofline: float) -> float:
        return roofline * self.ratio.get(name, FIRST_WALL_OVER_ROOFLINE)

    def measured(self, name: str, wall: float, roofline: float) -> None:
        self.ratio[name] = max(self.ratio.get(name, 0.0), wall / roofline)


# --- one case ---------------------------------------------------------------------------------------------------
def chunk_steps(slot: int, ids: list[int], chunk: int) -> list:
    """The prompt ``ids`` as TARGET steps of ``chunk`` rows of ``slot`` (the last may be shorter); only the last
    picks a row (its last: the prompt's next-token logits), as the engine runs a chunked prefill."""
    from dsa_runtime.model.step import Step, StepKind

    steps = []
    for start in range(0, len(ids), chunk):
        n = min(chunk, len(ids) - start)
        last = start + n == len(ids)
        pick = torch.tensor([n - 1] if last else [], dtype=torch.int64)
        steps.append(Step.of(StepKind.TARGET, [slot] * n, ids[start:start + n], list(range(start, start + n)),
                             pick=pick))
    return steps


def run_chunks(runner, steps: list) -> tuple[list[float], list[int], list[int], torch.Tensor]:
    """Each step synchronised: wall ms, peak bytes allocated and peak above what was allocated before it (CPU:
    zeros), and the last step's logits."""
    cuda = runner.device.type == "cuda"
    wall, peak, transient = [], [], []
    logits = None
    for step in steps:
        sync(runner.device)
        base = torch.cuda.memory_allocated(runner.device) if cuda else 0
        if cuda:
            torch.cuda.reset_peak_memory_stats(runner.device)
        t0 = time.perf_counter()
        logits = runner.run(step)
        sync(runner.device)
        wall.append((time.perf_counter() - t0) * 1e3)
        top = torch.cuda.max_memory_allocated(runner.device) if cuda else 0
        peak.append(top)
        transient.append(top - base)
    return wall, peak, transient, logits


def profile_step(runner, kernels, step, layers: int) -> tuple[dict, dict[str, float]]:
    """``step`` once under torch.profiler with ``kernels`` (scoped): ms per layer by family column, the family
    methods' calls per layer, and the unknown kernel names' ms."""
    from torch.profiler import ProfilerActivity, profile

    cuda = runner.device.type == "cuda"
    runner.kernels = kernels
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        runner.run(step)
        sync(runner.device)
    items, unlinked = profiled_items(prof, cuda)  # kernels the profiler tied to no op are classified by name
    columns, unknown = classify(items)
    total_us = sum(columns.values())
    calls = Counter(e.name[len(SCOPE_PREFIX):] for e in prof.events() if e.name.startswith(SCOPE_PREFIX))
    return {"ms_per_layer": {c: us / 1e3 / layers for c, us in columns.items()},
            "total_ms": total_us / 1e3, "unlinked_ms": unlinked / 1e3, "device": "cuda" if cuda else "cpu",
            "calls_per_layer": {m: n / layers for m, n in sorted(calls.items())}}, {
        n: us / 1e3 for n, us in unknown.items()}


def run_case(runner, bset: BackendSet, profiled, slot: int, ids: list[int], prompt: int, chunk: int,
             rates: dict, kv_bytes_per_page: int) -> tuple[dict, dict[str, float]]:
    """Prefill ``ids[:prompt]`` in chunks of ``chunk`` with ``bset``'s kernels, then profile its last chunk
    with ``profiled`` (the same kernels, scoped). Returns the JSON row and the unknown kernel names' ms."""
    config = runner.config
    runner.kernels = bset.kernels
    steps = chunk_steps(slot, ids[:prompt], chunk)
    wall, peak, transient, logits = run_chunks(runner, steps)
    finite = bool(torch.isfinite(logits).all())
    profile, unknown = profile_step(runner, profiled, steps[-1], config.num_hidden_layers)
    flops, roof, _ = case_roofline(config, prompt, chunk, rates)
    wall_s = sum(wall) / 1e3
    cuda = runner.device.type == "cuda"
    row = {
        "set": bset.name, "prompt": prompt, "chunk": chunk, "chunks": len(steps), "wall_s": wall_s,
        "tokens_per_s": prompt / wall_s, "chunk_ms": wall, "flops": flops, "roofline_s": roof,
        "roofline_fraction": roof / wall_s, "profile": profile, "finite": finite,
        "kv_bytes": -(-prompt // runner.cache.page_size) * kv_bytes_per_page,
        "memory": {"peak_bytes": max(peak), "transient_bytes": transient} if cuda else None,
    }
    return row, unknown


# --- the run ----------------------------------------------------------------------------------------------------
def warm_up(runner, bset: BackendSet, slot: int, ids: list[int], chunk: int) -> float:
    """Every chunk of the longest prompt with ``bset``'s kernels (compiles, autotunes); seconds. An H100 run
    that warmed only the first and last chunks compiled for 4 s inside the timed second chunk (16K of context)."""
    runner.kernels = bset.kernels
    steps = chunk_steps(slot, ids, chunk)
    t0 = time.perf_counter()
    for step in steps:
        runner.run(step)
    sync(runner.device)
    return time.perf_counter() - t0


def run_all(runner, sets: list[BackendSet], slot: int, ids: list[int], rates: dict, args, out: dict,
            budget: Budget) -> None:
    """Every case (chunk size, prompt, set), estimated against ``budget`` first; rows and skips appended to
    ``out`` and the JSON rewritten after each."""
    config = runner.config
    per_page = S.cache_bytes_per_page(config, args.page_size, args.kv_layout)
    running = [s for s in sets if s.kernels is not None]
    profiled = {s.name: scoped(s.kernels) for s in running}
    warmed: set[tuple[str, int]] = set()
    for chunk in args.chunk_list:
        _, warm_roof, warm_last = case_roofline(config, len(ids), chunk, rates)  # a warm-up runs all of ``ids``
        for prompt in args.prompt_list:
            if prompt > len(ids):
                out["rows"].append({"prompt": prompt, "chunk": chunk, "skipped": "its KV cache does not fit"})
                continue
            _, roof, last = case_roofline(config, prompt, chunk, rates)
            for bset in list(running):
                need = budget.estimate(bset.name, roof + last)
                if (bset.name, chunk) not in warmed:
                    first = not any(name == bset.name for name, _ in warmed)
                    need += budget.estimate(bset.name, warm_roof + warm_last)
                    need += COMPILE_ALLOWANCE_S * (first and runner.device.type == "cuda")
                if need > budget.left():
                    why = f"estimated {need:.0f} s, {max(budget.left(), 0):.0f} s of --budget-s left"
                    out["rows"].append({"set": bset.name, "prompt": prompt, "chunk": chunk, "skipped": why})
                    log(f"{bset.name} {prompt} / {chunk}: skipped ({why})")
                    continue
                try:
                    if (bset.name, chunk) not in warmed:
                        secs = warm_up(runner, bset, slot, ids, chunk)
                        warmed.add((bset.name, chunk))
                        out["warmups"].append({"set": bset.name, "chunk": chunk, "seconds": secs})
                        log(f"{bset.name}: warm-up at chunk {chunk} in {secs:.1f} s")
                    row, unknown = run_case(runner, bset, profiled[bset.name], slot, ids, prompt, chunk, rates,
                                           per_page)
                except (RuntimeError, ValueError) as exc:  # a backend's failure (OOM included) costs its set only
                    why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
                    out["rows"].append({"set": bset.name, "prompt": prompt, "chunk": chunk, "skipped": why})
                    bset.status = f"failed at {prompt} / {chunk}: {why}"
                    out["sets"] = [s.describe() for s in sets]
                    log(f"{bset.name} {prompt} / {chunk}: {why}; the set stops here")
                    running.remove(bset)
                    if runner.device.type == "cuda":
                        torch.cuda.empty_cache()
                    write_json(args.json, out)
                    continue
                budget.measured(bset.name, row["wall_s"], row["roofline_s"])
                for name, ms in unknown.items():
                    out["unknown_kernels_ms"][name] = out["unknown_kernels_ms"].get(name, 0.0) + ms
                out["rows"].append(row)
                mem = row["memory"]
                log(f"{bset.name} {prompt} / {chunk}: {row['wall_s']:.2f} s, {row['tokens_per_s']:.0f} tok/s, "
                    f"{100 * row['roofline_fraction']:.1f}% of roofline"
                    + (f", peak {mem['peak_bytes'] / 2**30:.1f} GiB" if mem else "") + f", finite {row['finite']}")
                write_json(args.json, out)


def main(argv: list[str] | None = None) -> int:
    t_start = time.perf_counter()
    args = parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("prefill_real_gpu: needs a CUDA device (or --dry-run)", file=sys.stderr)
        return 2
    from dsa_runtime.cache import KVCache
    from dsa_runtime.model.slots import SlotTable
    from dsa_runtime.plugin_manager import get_manager

    device = torch.device("cpu" if args.dry_run else "cuda")
    config = S.dry_config() if args.dry_run else S.real_config(args.layers, args.dense_layers)
    manager = get_manager()
    sets = backend_sets(lambda name: _available(manager, name), args.peer)
    for bset in sets:
        if bset.status == "ready":
            resolve_set(bset, config, args)
    if sets[0].kernels is None:
        print(f"prefill_real_gpu: our kernels do not resolve: {sets[0].status}", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)"
    rates = matmul_rates(device)
    log(f"{name}: bf16 {rates['bf16_tflops']:.1f}, FP8 {rates['fp8_tflops']:.1f} TFLOP/s ({rates['how']})")
    plan = print_plan(config, sets, args, rates)

    t0 = time.perf_counter()
    runner = build_runner(config, sets[0].kernels, device, args)
    weights = S.weight_bytes(runner.model)
    log(f"model built in {time.perf_counter() - t0:.1f} s: {config.num_hidden_layers} layers, "
        f"{weights['total'] / 1e9:.2f} GB of weights")
    per_page = S.cache_bytes_per_page(config, args.page_size, args.kv_layout)
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 1 << 62
    fit = [p for p in args.prompt_list if (-(-p // args.page_size) + 1) * per_page <= free - args.headroom_gib * 2**30]
    longest = max(fit, default=args.chunk_list[0])
    pages = -(-longest // args.page_size)
    runner.cache = KVCache(config, pages + 1, args.page_size, sets[0].kernels.kv_layout, device, torch.bfloat16)
    runner.setup(1, pages * args.page_size)
    table = SlotTable(runner.max_requests, runner.max_pages)
    slot = table.acquire()
    runner.state.apply(table.updates([(slot, list(range(1, pages + 1)))]))
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, config.vocab_size, (longest if fit else 0,), generator=gen).tolist()
    log(f"KV cache: {pages} pages ({runner.cache.total_bytes / 2**30:.2f} GiB) for {longest} tokens")
    out: dict[str, Any] = {
        "bench": "prefill_real_gpu", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": name,
        "torch": torch.__version__, "python": platform.python_version(),
        "settings": {k: v for k, v in vars(args).items() if not k.endswith("_list")},
        "rates": rates, "sets": [s.describe() for s in sets], "plan": plan,
        "model": {"layers": config.num_hidden_layers, "dense_layers": config.first_k_dense_replace,
                  "hidden": config.hidden_size, "heads": config.num_attention_heads,
                  "experts": config.n_routed_experts, "index_topk": config.index_topk,
                  "weight_bytes": weights["total"]},
        "memory": {"free_bytes": free, "cache_bytes": runner.cache.total_bytes, "bytes_per_page": per_page,
                   "after_build_bytes": torch.cuda.memory_allocated(device) if device.type == "cuda" else None},
        "warmups": [], "rows": [], "unknown_kernels_ms": {},
    }
    run_all(runner, sets, slot, ids, rates, args, out, Budget(args.budget_s, t_start))
    out["elapsed_s"] = time.perf_counter() - t_start
    write_json(args.json, out)
    print_table(out)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
