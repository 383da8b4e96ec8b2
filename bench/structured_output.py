"""Structured output on the embedded model, straight through the engine: validity with and without the
constraint, and the constraint's cost in tokens/s.

    python bench/structured_output.py                    # 50 schemas; batch 16 overhead
    python bench/structured_output.py --schemas 20 --batch 16 --steps 96

* **Validity**: ``--schemas`` random object schemas (nested objects, enums, bounded arrays and numbers, short
  strings; ``dsa_runtime.testing.json_schemas``), one request each at temperature 1.0, asking for JSON. With
  the constraint every output should parse and validate (``jsonschema``); without it, the share that happens
  to is the contrast.
* **Overhead**: ``--batch`` requests decoding together for ``--steps`` tokens each, greedy, under a schema
  whose outputs always run that long (an array of exactly N enum strings), against the same batch without a
  constraint (EOS ignored, same token count). Tokens/s of each; the ratio is the overhead.

Prints tables and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_json  # noqa: E402


def _run(engine: Any, prompts: list[list[int]], params: list[Any]) -> tuple[dict[str, Any], float]:
    start = time.perf_counter()
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"r{i}-{start}", prompt, p)
    last: dict[str, Any] = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                last[out.request_id] = out
    wall = time.perf_counter() - start
    return {k.split("-")[0]: v for k, v in last.items()}, wall


def validity(engine: Any, n: int) -> dict[str, Any]:
    import jsonschema

    from dsa_runtime.engine import SamplingParams
    from dsa_runtime.engine.structured import StructuredOutput
    from dsa_runtime.testing.json_schemas import random_object_schemas

    schemas = random_object_schemas(n, seed=21)
    prompt = engine.tokenizer.encode("<｜User｜>Reply with the data as JSON.<｜Assistant｜></think>")
    result = {}
    for constrained in (True, False):
        params = [SamplingParams(temperature=1.0, max_tokens=400, seed=i,
                                 structured=StructuredOutput.json_schema(s) if constrained else None)
                  for i, s in enumerate(schemas)]
        outs, _ = _run(engine, [prompt] * n, params)
        valid = 0
        for i, schema in enumerate(schemas):
            try:
                jsonschema.validate(json.loads(outs[f"r{i}"].text), schema)
                valid += 1
            except (ValueError, jsonschema.ValidationError):
                pass
        result["constrained" if constrained else "free"] = {"valid": valid, "total": n}
    return result


def overhead(engine: Any, batch: int, steps: int) -> dict[str, Any]:
    from dsa_runtime.engine import SamplingParams
    from dsa_runtime.engine.structured import StructuredOutput

    # ", " between items and one or two tokens per enum value: about 3 tokens per item.
    items = max(1, (steps - 2) // 3)
    schema = {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": items, "maxItems": items}
    prompts = [engine.tokenizer.encode(f"<｜User｜>List {i}.<｜Assistant｜></think>") for i in range(batch)]
    spec = StructuredOutput.json_schema(schema)
    rows = {}
    for name, make in (("schema", lambda n: SamplingParams(temperature=0, max_tokens=4 * n, structured=spec)),
                       ("free", lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))):
        _run(engine, prompts, [make(steps)] * batch)  # warm-up (compiles, grammar cache)
        outs, wall = _run(engine, prompts, [make(steps)] * batch)
        tokens = [len(o.token_ids) for o in outs.values()]
        rows[name] = {"tokens": sum(tokens), "wall_s": wall, "tok_s": sum(tokens) / wall,
                      "finish": sorted({o.finish_reason for o in outs.values()})}
        if name == "schema":
            steps = max(tokens)  # the free run generates as many tokens
    rows["ratio"] = rows["schema"]["tok_s"] / rows["free"]["tok_s"]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schemas", type=int, default=50)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=96, help="tokens per request in the overhead run")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--out", type=Path, default=Path("bench/results/structured_output.json"))
    args = parser.parse_args(argv)
    if min(args.schemas, args.batch, args.steps) < 1:
        parser.error("--schemas, --batch and --steps must be >= 1")
    import torch

    from dsa_runtime.engine import Engine, EngineConfig

    engine = Engine(EngineConfig(dtype=args.dtype, max_running_requests=max(64, args.schemas, args.batch)))
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    valid = validity(engine, args.schemas)
    over = overhead(engine, args.batch, args.steps)
    print(f"\n{device}, embedded model ({args.dtype})")
    print(f"| {args.schemas} random schemas, temperature 1.0 | parse and validate |\n|---|---:|")
    for name in ("constrained", "free"):
        v = valid[name]
        print(f"| {'with the schema' if name == 'constrained' else 'without (prompt only)'} | "
              f"{v['valid']}/{v['total']} ({100 * v['valid'] / v['total']:.0f}%) |")
    print(f"\n| batch {args.batch}, greedy | tokens | wall | tokens/s |\n|---|---:|---:|---:|")
    for name in ("schema", "free"):
        r = over[name]
        print(f"| {name} | {r['tokens']} | {r['wall_s']:.2f} s | {r['tok_s']:.0f} |")
    print(f"schema / free tokens/s: {over['ratio']:.2f}")
    payload = {"device": device, "host": platform.node(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "torch": torch.__version__, "dtype": args.dtype, "validity": valid, "overhead": over,
               "batch": args.batch}
    write_json(args.out, payload)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
