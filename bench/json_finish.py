"""Do schema-constrained requests finish? The embedded model on held-out JSON requests, through the engine.

    python bench/json_finish.py                                   # 48 requests, temperature 0 and 1.0
    python bench/json_finish.py --model DIR --n 48 --max-tokens 200 --out bench/results/json_finish.json

The held-out set (``train.tinychat.json_answers.heldout_set``: key names, record kinds and wordings never
trained on; unbounded numbers, strings and arrays, nested objects, enums, booleans; the schema in a system
turn, after the question, as a list of keys or not in the prompt at all; a quarter in thinking mode) is
encoded as the server encodes a chat and decoded under its schema as ``response_format: json_schema`` is
(xgrammar, compact JSON; in thinking mode the constraint starts after ``</think>``). A request counts when
it stops within ``--max-tokens`` and its content parses and validates (``jsonschema``); the others either ran
out of tokens (``length``) or are invalid. Prints a table per temperature and one by what the schema holds
and where the prompt puts it, and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
if str(ROOT) not in sys.path:  # the held-out set comes from the training generator, in the checkout
    sys.path.insert(0, str(ROOT))
from common import write_json  # noqa: E402

TEMPERATURES = (0.0, 1.0)


def run(llm: Any, items: list[Any], temperature: float, max_tokens: int) -> list[dict[str, Any]]:
    """One row per request: ``ok`` (stopped, parses, validates), ``finish``, ``tokens``, ``content``."""
    import jsonschema

    from dsa_runtime import SamplingParams
    from dsa_runtime.engine.chat import parse_completion
    from dsa_runtime.engine.structured import StructuredOutput

    think_end = llm.tokenizer.token_to_id("</think>")
    prompts, params = [], []
    for i, conv in enumerate(items):
        thinking = conv.mode == "thinking"
        prompts.append(llm.chat_prompt(conv.messages[:-1], None, thinking))
        spec = StructuredOutput.json_schema(conv.expect["schema"], think_end if thinking else None)
        params.append(SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=i, structured=spec))
    outs = llm.generate([ids for _text, ids in prompts], params)
    rows = []
    for (text, _ids), out, conv in zip(prompts, outs, items, strict=True):
        res = parse_completion(llm.chat_format, text, out, conv.mode == "thinking")
        ok = out.finish_reason == "stop"
        if ok:
            try:
                jsonschema.validate(json.loads(res.content or ""), conv.expect["schema"])
            except (ValueError, jsonschema.ValidationError):
                ok = False
        rows.append({"ok": ok, "finish": out.finish_reason, "tokens": len(out.token_ids),
                     "content": res.content, "reasoning": res.reasoning_content})
    return rows


def tally(items: list[Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Overall counts, and ok / total per group (what the schema holds, prompt style, mode)."""
    from train.tinychat.json_answers import schema_features

    groups: dict[str, list[int]] = {}
    for conv, row in zip(items, rows, strict=True):
        keys = [*sorted(schema_features(conv.expect["schema"])), f"style={conv.expect['style']}",
                f"mode={conv.mode}"]
        for key in keys:
            groups.setdefault(key, []).append(int(row["ok"]))
    n = len(rows)
    ok = sum(r["ok"] for r in rows)
    length = sum(r["finish"] == "length" for r in rows)
    return {"ok": ok, "total": n, "share": ok / n, "length": length, "invalid": n - ok - length,
            "tokens_median": statistics.median(r["tokens"] for r in rows),
            "tokens_max": max(r["tokens"] for r in rows),
            "groups": {k: {"ok": sum(v), "total": len(v)} for k, v in sorted(groups.items())},
            "failures": [{"request": i, "finish": r["finish"], "tokens": r["tokens"],
                          "content": (r["content"] or "")[:160], "reasoning": (r["reasoning"] or "")[:160]}
                         for i, r in enumerate(rows) if not r["ok"]]}


def _shown(model: Path) -> str:
    """The model folder as the JSON records it: relative to the checkout when inside it (no machine's path)."""
    try:
        return str(model.resolve().relative_to(ROOT))
    except ValueError:
        return model.name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="checkpoint folder (default: the embedded tiny-chat)")
    ap.add_argument("--n", type=int, default=48, help="held-out requests")
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--seed", type=int, default=None, help="another draw of the held-out set")
    ap.add_argument("--out", type=Path, default=Path("bench/results/json_finish.json"))
    args = ap.parse_args(argv)
    if min(args.n, args.max_tokens) < 1:
        ap.error("--n and --max-tokens must be >= 1")
    import torch

    from dsa_runtime import LLM
    from dsa_runtime.loader import default_model_path
    from train.tinychat.json_answers import HELDOUT_SEED, heldout_set

    model = Path(args.model) if args.model else default_model_path()
    items = heldout_set(args.n, HELDOUT_SEED if args.seed is None else args.seed)
    llm = LLM(model=str(model), max_running_requests=max(64, args.n))
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    results = {}
    for temperature in TEMPERATURES:
        t0 = time.perf_counter()
        rows = run(llm, items, temperature, args.max_tokens)
        results[f"{temperature:g}"] = {**tally(items, rows), "wall_s": round(time.perf_counter() - t0, 1)}

    print(f"\n{device}, {model.name}, {len(items)} held-out schema requests, max_tokens {args.max_tokens}")
    print("| temperature | finish and validate | ran out of tokens | invalid | median / max tokens |")
    print("|---|---:|---:|---:|---:|")
    for t, r in results.items():
        print(f"| {t} | {r['ok']}/{r['total']} = {r['share']:.1%} | {r['length']} | {r['invalid']} | "
              f"{r['tokens_median']:g} / {r['tokens_max']} |")
    print("\n| schema holds / prompt | " + " | ".join(f"temperature {t}" for t in results) + " |")
    print("|---|" + "---:|" * len(results))
    for key in next(iter(results.values()))["groups"]:
        cells = [f"{r['groups'][key]['ok']}/{r['groups'][key]['total']}" for r in results.values()]
        print(f"| {key} | " + " | ".join(cells) + " |")
    for t, r in results.items():
        for f in r["failures"][:3]:
            print(f"temperature {t}, request {f['request']} ({f['finish']}, {f['tokens']} tokens): {f['content']!r}")
    payload = {"device": device, "host": platform.node(),
               "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__,
               "threads": torch.get_num_threads(), "model": _shown(model),
               "requests": len(items), "max_tokens": args.max_tokens, "results": results}
    write_json(args.out, payload)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
