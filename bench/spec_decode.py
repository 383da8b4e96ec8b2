"""Decode speed with and without MTP speculation, the embedded tiny-chat model, CPU or GPU.

    python bench/spec_decode.py [--batches 1,8,32] [--max-tokens 200] [--steps 3] [--json PATH]

Method: B held-out chat prompts (``bench/tiny_eval.py``'s, greedy, EOS honoured: drafts are only as good as the
text is natural) run to completion on two engines built in this process: the default one (CUDA graphs and
overlap scheduling on a GPU) and the same with ``--speculative-algorithm EAGLE --speculative-num-steps N``.
Timing starts once every request has its first token (prefill excluded) and stops when the last one finishes;
tokens/s = output tokens produced in that window / its length. Each batch runs once untimed first (compiles,
lazy buffers). Both engines produce the same greedy tokens up to bf16 verify-vs-decode rounding; the table says
how many requests differ. ``engine_gpu.py --speculative`` and ``engine_cpu.py --speculative`` run this too.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def chat_prompts(engine: Any, n: int, seed: int = 2026) -> list[list[int]]:
    """Token ids of ``n`` held-out chat prompts (all kinds, cycled), encoded for ``engine``'s model."""
    from tiny_eval import held_out

    from dsa_runtime.engine.llm import LLM

    items = held_out(max(n, 8), seed)
    llm = LLM(engine=engine)
    return [llm.chat_prompt(c.messages[:1], c.tools, c.mode == "thinking")[1]
            for c in (items[i % len(items)] for i in range(n))]


def _sync(engine: Any) -> None:
    import torch

    if engine.runner.device.type == "cuda":
        torch.cuda.synchronize()


def _free_device_memory() -> None:
    """Give a finished engine's cache and graph pools back before the next engine sizes its cache."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_batch(engine: Any, prompts: list[list[int]], max_tokens: int, tag: str) -> dict[str, Any]:
    """All prompts to completion; the decode window's tokens/s, steps and each request's tokens."""
    from dsa_runtime.engine import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    for i, p in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", p, params)
    tokens: dict[str, list[int]] = {}
    counted = 0
    t0 = None
    steps = 0
    stats0 = engine.stats()
    while engine.has_unfinished():
        outs = engine.step()
        if t0 is not None:
            steps += 1
            counted += sum(len(o.new_token_ids) for o in outs)
        for o in outs:
            if o.finished:
                tokens[o.request_id] = o.token_ids
        if t0 is None and all(r.num_output_tokens > 0 for r in engine._requests.values()):
            _sync(engine)
            t0 = time.perf_counter()
    _sync(engine)
    wall = time.perf_counter() - (t0 or time.perf_counter())
    st = engine.stats()
    verifies = st.spec_verifies_total - stats0.spec_verifies_total
    emitted = st.spec_emitted_tokens_total - stats0.spec_emitted_tokens_total
    return {"tokens_per_s": counted / wall if wall > 0 else 0.0, "decode_s": wall, "steps": steps,
            "tokens": counted, "accept_length": emitted / verifies if verifies else None,
            "outputs": [tokens[f"{tag}-{i}"] for i in range(len(prompts))]}


def measure(batches: list[int], max_tokens: int, num_steps: int, device: str = "auto") -> list[dict[str, Any]]:
    """One row per (batch, mode) with ``speedup`` (spec over plain) on the spec rows."""
    from dsa_runtime.engine import Engine, EngineConfig

    prompts: list[list[int]] = []
    rows: list[dict[str, Any]] = []
    results: dict[tuple[str, int], dict[str, Any]] = {}
    for mode in ("plain", "spec"):
        extra = {"speculative_algorithm": "EAGLE", "speculative_num_steps": num_steps} if mode == "spec" else {}
        engine = Engine(EngineConfig(device=device, max_running_requests=max(64, max(batches)), **extra))
        prompts = prompts or chat_prompts(engine, max(batches))
        for b in batches:
            run_batch(engine, prompts[:b], max_tokens, f"warm{b}")
            res = run_batch(engine, prompts[:b], max_tokens, f"b{b}")
            results[(mode, b)] = res
            print(f"{mode:5} batch {b:3d}: {res['tokens_per_s']:8.0f} tok/s, {res['steps']} steps"
                  + (f", accept length {res['accept_length']:.2f}" if res["accept_length"] else ""), flush=True)
        del engine
        _free_device_memory()
    for b in batches:
        plain, spec = results[("plain", b)], results[("spec", b)]
        differ = sum(x != y for x, y in zip(plain["outputs"], spec["outputs"], strict=True))
        for mode, res in (("plain", plain), ("spec", spec)):
            rows.append({"mode": mode, "batch": b, "tokens_per_s": res["tokens_per_s"], "steps": res["steps"],
                         "tokens": res["tokens"], "decode_s": res["decode_s"], "accept_length": res["accept_length"],
                         "speedup": res["tokens_per_s"] / plain["tokens_per_s"] if mode == "spec" else 1.0,
                         "outputs_differing": differ if mode == "spec" else 0})
    return rows


def print_table(rows: list[dict[str, Any]], device_name: str) -> None:
    print(f"\n| batch | plain tok/s | spec tok/s | speed-up | accept length | requests differing |  ({device_name})")
    print("|---:|---:|---:|---:|---:|---:|")
    by = {(r["mode"], r["batch"]): r for r in rows}
    for b in sorted({r["batch"] for r in rows}):
        p, s = by[("plain", b)], by[("spec", b)]
        print(f"| {b} | {p['tokens_per_s']:.0f} | {s['tokens_per_s']:.0f} | {s['speedup']:.2f}x | "
              f"{s['accept_length'] or 0:.2f} | {s['outputs_differing']} of {b} |")


def device_name(device: str) -> str:
    import torch

    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return torch.cuda.get_device_name()
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--steps", type=int, default=3, help="--speculative-num-steps")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", default="bench/results/spec_decode.json")
    args = ap.parse_args(argv)
    rows = measure([int(b) for b in args.batches.split(",")], args.max_tokens, args.steps, args.device)
    name = device_name(args.device)
    print_table(rows, name)
    out = {"bench": "spec_decode", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": name,
           "python": platform.python_version(), "settings": vars(args), "rows": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
