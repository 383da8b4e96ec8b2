"""Engine throughput on CPU: prefill and decode tokens/s for the tiny presets at batch 1, 8 and 32, beside
Hugging Face transformers generating greedily on the same checkpoint in the same run.

    .venv/bin/python bench/engine_cpu.py [--presets tiny-v32,tiny-v3] [--batches 1,8,32] [--prompt-len 64]
        [--gen-tokens 16] [--dtype bfloat16] [--no-hf] [--json bench/results/engine_cpu.json]

Method: B random prompts of equal length arrive together; prefill = time until every request has its first
token (B * prompt_len tokens), decode = the time after that until each has ``gen_tokens`` more (B * gen_tokens
tokens). transformers: ``generate`` with 1 new token (prefill) and with 1 + gen_tokens (decode = the
difference). Each measurement is the best of ``--repeat`` runs (the 2-core machines are shared and noisy).
``agree1`` / ``agree`` = fraction of requests whose first greedy token / all greedy tokens equal
transformers' (the two differ in indexer precision and rounding, so near-ties of the
random-weight model's flat logits may flip, and one flip changes the rest of a sequence).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hf_baseline import hf_run, load_hf  # noqa: E402


def engine_run(engine: Any, prompts: list[list[int]], gen_tokens: int) -> dict[str, Any]:
    from dsa_runtime.engine import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=1 + gen_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(f"b{i}", p, params)
    first: set[str] = set()
    tokens: dict[str, list[int]] = {}
    t1 = None
    while engine.has_unfinished():
        for out in engine.step():
            first.add(out.request_id)
            tokens[out.request_id] = out.token_ids
        if t1 is None and len(first) == len(prompts):
            t1 = time.perf_counter()
    t2 = time.perf_counter()
    assert t1 is not None and engine.stats().pages_used == 0
    return {
        "prefill_s": t1 - t0,
        "decode_s": t2 - t1,
        "tokens": [tokens[f"b{i}"] for i in range(len(prompts))],
    }


def bench_preset(preset: str, args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    from dsa_runtime.engine import Engine, EngineConfig
    from dsa_runtime.loader.make_checkpoint import make_checkpoint

    ckpt = make_checkpoint(work / preset, preset, seed=0)
    biggest = max(args.batches)
    engine = Engine(
        EngineConfig(
            model=str(ckpt),
            dtype=args.dtype,
            # Every request holds whole pages (64 tokens on CPU): size the pool so that all `biggest`
            # requests run at once, as they do in transformers (a pool sized in tokens left 4 of 32
            # requests waiting, so batch-32 decode ran as 28 + 4).
            max_total_tokens=biggest * _round_up(args.prompt_len + args.gen_tokens + 1, 256) + 1024,
            chunked_prefill_size=max(2048, biggest * args.prompt_len),
            max_running_requests=biggest,
            cpu_threads=args.threads,
        )
    )
    hf, hf_reason = (None, "--no-hf") if args.no_hf else load_hf(ckpt, work / f"{preset}-hf")
    rng = random.Random(0)
    vocab = engine.model_config.vocab_size
    warm = [[rng.randrange(3, vocab) for _ in range(8)]]
    engine_run(engine, warm, 2)  # first-call costs (lazy inits, allocator warm-up) out of the figures
    if hf is not None:
        hf_run(hf, warm, 2)
    rows = []
    for batch in args.batches:
        prompts = [[rng.randrange(3, vocab) for _ in range(args.prompt_len)] for _ in range(batch)]
        ours = _best(lambda p=prompts: engine_run(engine, p, args.gen_tokens), args.repeat)
        row: dict[str, Any] = {
            "preset": preset,
            "batch": batch,
            "prefill_tok_s": batch * args.prompt_len / ours["prefill_s"],
            "decode_tok_s": batch * args.gen_tokens / ours["decode_s"],
        }
        if hf is not None:
            theirs = _best(lambda p=prompts: hf_run(hf, p, args.gen_tokens), args.repeat)
            row["hf_prefill_tok_s"] = batch * args.prompt_len / theirs["prefill_s"]
            row["hf_decode_tok_s"] = batch * args.gen_tokens / theirs["decode_s"]
            row["prefill_ratio"] = row["prefill_tok_s"] / row["hf_prefill_tok_s"]
            row["decode_ratio"] = row["decode_tok_s"] / row["hf_decode_tok_s"]
            pairs = list(zip(ours["tokens"], theirs["tokens"], strict=True))
            row["agree1"] = sum(a[0] == b[0] for a, b in pairs) / batch
            row["agree"] = sum(a == b for a, b in pairs) / batch
        else:
            row["hf_skipped"] = hf_reason
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _best(run: Any, repeat: int) -> dict[str, Any]:
    """Fastest prefill and fastest decode over ``repeat`` runs (tokens of the first run)."""
    runs = [run() for _ in range(max(1, repeat))]
    return {
        "prefill_s": min(r["prefill_s"] for r in runs),
        "decode_s": min(r["decode_s"] for r in runs),
        "tokens": runs[0]["tokens"],
    }


HEADER = f"{'preset':<9} {'batch':>5} {'prefill tok/s':>14} {'decode tok/s':>13} " + (
    f"{'HF prefill':>11} {'HF decode':>10} {'x prefill':>10} {'x decode':>9} {'agree1':>7} {'agree':>6}"
)


def _line(row: dict[str, Any]) -> str:
    text = f"{row['preset']:<9} {row['batch']:>5} {row['prefill_tok_s']:>14.1f} {row['decode_tok_s']:>13.1f} "
    if "hf_prefill_tok_s" in row:
        text += (
            f"{row['hf_prefill_tok_s']:>11.1f} {row['hf_decode_tok_s']:>10.1f} {row['prefill_ratio']:>10.2f} "
            f"{row['decode_ratio']:>9.2f} {row['agree1']:>7.2f} {row['agree']:>6.2f}"
        )
    else:
        text += f"  (transformers skipped: {row['hf_skipped']})"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny-v32,tiny-v3")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--gen-tokens", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=2, help="runs per measurement; the best is kept")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument(
        "--threads", type=int, default=None,
        help="torch threads for both engines (process-wide; default: the engine's --cpu-threads default)",
    )  # fmt: skip
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    parser.add_argument("--speculative", action="store_true",
                        help="also tokens/s with and without MTP speculation on the embedded model at --batches "
                             "(bench/spec_decode.py: held-out chat prompts, 3 draft steps)")
    parser.add_argument("--json", default="bench/results/engine_cpu.json", help="where to write the results")
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]

    import torch

    print(HEADER, flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="dsa-bench-") as tmp:
        for preset in args.presets.split(","):
            rows += bench_preset(preset, args, Path(tmp))
    try:
        import transformers

        hf_version = transformers.__version__
    except ImportError:
        hf_version = None
    result = {
        "bench": "engine_cpu",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "platform": platform.platform(), "torch": torch.__version__, "transformers": hf_version},
        "settings": {"prompt_len": args.prompt_len, "gen_tokens": args.gen_tokens, "dtype": args.dtype, "repeat": args.repeat,
                     "backend": "auto (torch on CPU)"},
        "rows": rows,
    }  # fmt: skip
    if args.speculative:
        from spec_decode import device_name, measure, print_table

        spec_rows = measure(args.batches, 200, 3, "cpu")
        print_table(spec_rows, device_name("cpu"))
        result["speculative"] = spec_rows
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_file = out.with_suffix(out.suffix + ".tmp")
    tmp_file.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp_file, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
