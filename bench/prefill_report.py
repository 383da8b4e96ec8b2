"""The prefill bench's report: each case's roofline, the plan printed before the run, and the table after it
(``bench/prefill_real_gpu.py`` runs the cases)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_real_gpu import log  # noqa: E402
from kernel_families import COLUMNS  # noqa: E402
from prefill_flops import chunk_flops, prompt_flops, roofline_s  # noqa: E402

FIRST_WALL_OVER_ROOFLINE = 4.0  # a set's estimate before it has measured a case (25% of the roofline)
COMPILE_ALLOWANCE_S = 60.0  # a set's first warm-up: JIT compiles (Triton, TileLang, DeepGEMM) and autotuning


def case_roofline(config, prompt: int, chunk: int, rates: dict) -> tuple[dict, float, float]:
    """FLOPs of a prompt in chunks, its roofline seconds, and the roofline of its last chunk (the profiled one)."""
    flops = prompt_flops(config, prompt, chunk)
    start = (prompt - 1) // chunk * chunk
    last = chunk_flops(config, start, prompt - start, last=True)
    return flops, roofline_s(flops, rates["bf16_tflops"], rates["fp8_tflops"]), roofline_s(
        last, rates["bf16_tflops"], rates["fp8_tflops"])


def print_plan(config, sets: list, args, rates: dict) -> list[dict]:
    """The cases, their chunks and roofline seconds, and the time they are estimated at; printed and returned.
    ``sets``: the bench's backend sets (name, kernels or None, status, missing)."""
    running = [s.name for s in sets if s.kernels is not None]
    plan, total = [], 0.0
    for chunk in args.chunk_list:
        for prompt in args.prompt_list:
            _, roof, last = case_roofline(config, prompt, chunk, rates)
            est = FIRST_WALL_OVER_ROOFLINE * (roof + last)
            plan.append({"prompt": prompt, "chunk": chunk, "chunks": -(-prompt // chunk), "roofline_s": roof,
                         "estimate_s": est})
            total += est * len(running)
    log(f"plan: sets {', '.join(running) or 'none'}; {len(plan)} cases each; roofline at bf16 "
        f"{rates['bf16_tflops']:.0f} / FP8 {rates['fp8_tflops']:.0f} TFLOP/s")
    for p in plan:
        log(f"  {p['prompt']} tokens in {p['chunks']} chunks of {p['chunk']}: roofline {p['roofline_s']:.2f} s, "
            f"estimated {p['estimate_s']:.1f} s per set")
    log(f"  estimated {total:.0f} s of prefill + {COMPILE_ALLOWANCE_S:.0f} s compile allowance per set; "
        f"budget {args.budget_s:.0f} s")
    for s in sets:
        if s.kernels is None:
            log(f"  set {s.name}: {s.status}" + "".join(f"\n    {m}" for m in s.missing))
        elif s.missing:
            log(f"  set {s.name} runs without: " + "; ".join(s.missing))
    return plan


def fmt_gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def print_table(out: dict) -> None:
    """The throughput / roofline / memory table, then the per-family split of each case's last chunk."""
    s, r = out["settings"], out["rates"]
    print(f"\n{out['device']}: {out['model']['layers']} layers ({out['model']['dense_layers']} dense), weights "
          f"{out['model']['weight_bytes'] / 1e9:.1f} GB, KV {s['kv_layout']}, bf16 {r['bf16_tflops']:.0f} / FP8 "
          f"{r['fp8_tflops']:.0f} TFLOP/s")
    for bset in out["sets"]:
        picked = {m: b for m, b in bset["kernels"].items() if m in (
            "sparse_attn.prefill", "indexer.logits_ragged", "topk.topk", "moe.experts")}
        print(f"  {bset['name']}: {bset['status']}" + (f" {picked}" if picked else "")
              + "".join(f"; missing {m}" for m in bset["missing"]))
    rows = [x for x in out["rows"] if "skipped" not in x]
    tput = {(x["prompt"], x["chunk"], x["set"]): x["tokens_per_s"] for x in rows}
    print("| prompt | chunk | set | tok/s | wall s | roofline s | % roofline | ours / peer | peak GiB "
          "| transient GiB first / last chunk | KV GiB |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for x in out["rows"]:
        if "skipped" in x:
            print(f"| {x['prompt']} | {x['chunk']} | {x.get('set', '-')} | skipped: {x['skipped']} | | | | | | | |")
            continue
        peer = tput.get((x["prompt"], x["chunk"], "peer"))
        ratio = f"{tput[(x['prompt'], x['chunk'], 'ours')] / peer:.2f}" if peer and x["set"] == "ours" else ""
        mem = x["memory"]
        peak = fmt_gib(mem["peak_bytes"]) if mem else "-"
        trans = f"{fmt_gib(mem['transient_bytes'][0])} / {fmt_gib(mem['transient_bytes'][-1])}" if mem else "-"
        print(f"| {x['prompt']} | {x['chunk']} | {x['set']} | {x['tokens_per_s']:.0f} | {x['wall_s']:.3f} | "
              f"{x['roofline_s']:.3f} | {100 * x['roofline_fraction']:.1f} | {ratio} | {peak} | {trans} | "
              f"{fmt_gib(x['kv_bytes'])} |")
    unit = "ms" if not rows or rows[0]["profile"]["device"] == "cuda" else "CPU ms"
    print(f"\nLast chunk of each case, {unit} per layer by family (torch.profiler):")
    print("| prompt | chunk | set | " + " | ".join(COLUMNS) + " | total | wall |")
    print("|---:|---:|---|" + "---:|" * (len(COLUMNS) + 2))
    layers = out["model"]["layers"]
    for x in rows:
        p = x["profile"]["ms_per_layer"]
        print(f"| {x['prompt']} | {x['chunk']} | {x['set']} | " + " | ".join(f"{p[c]:.3f}" for c in COLUMNS)
              + f" | {sum(p.values()):.3f} | {x['chunk_ms'][-1] / layers:.3f} |")
    unknown = sorted(out["unknown_kernels_ms"].items(), key=lambda kv: -kv[1])
    if unknown:
        print("\nKernels no family method launched and no name pattern knows (counted as other; "
              "bench/kernel_families.py NAME_TABLE):")
        for name, ms in unknown[:30]:
            print(f"  {ms:9.3f} ms  {name[:160]}")
