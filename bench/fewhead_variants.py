"""Build variants of the few-head ``fp8_656`` CUDA kernel (``plugins/cuda_hopper/cuda/fewhead_fp8.cu``) side by side:
each is checked against the reference backend, then every variant is timed on the same inputs in one run.

    python bench/fewhead_variants.py [--variants V ...] [--json PATH]   (default bench/results/fewhead_variants.json)

A variant is a :class:`CudaFewHeadConfig`: a name of :data:`VARIANTS` or fields over the default, such as
``partial_fp16=0,stages=3`` (``default`` is always timed first). Checks: the 14 cases of
``bench/fewhead_wgmma.py`` (ragged k, 30-90% ``-1``, empty queries, wild q, small non-power-of-two row scales, 1-16
heads, 1-4 queries). Timings: CUDA-graph replays on ``bench/fewhead_decode.py``'s inputs (k 2048 random slots of
each request's own 32K context), plus, at 16 heads and batch 64, every slot ``-1`` (no row read: the arithmetic and
the loop alone), every slot of a query the same one (rows from the L2: no DRAM) and k consecutive slots; and
"layers": the time per call at 16 heads and batch 64 in one graph of ``fewhead_decode.LAYERS`` calls with their own
random slots (a decode step's layers, the graph's launch paid once). The table prints each variant's ms and its
ratio to ``default`` in the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention_setup import SM_SCALE, cache_pool  # noqa: E402
from common import device_info, graph_layers_ms, graph_ms, write_json  # noqa: E402
from fewhead_decode import CONTEXT, layer_inputs  # noqa: E402
from fewhead_wgmma import SHAPES, check, shape_inputs  # noqa: E402

from dsa_runtime.plugins.cuda_hopper.cuda import nvrtc  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.cuda.fewhead_fp8 import CudaFewHeadConfig, decode_fewhead_fp8_cuda  # noqa: E402

VARIANTS = {
    "default": CudaFewHeadConfig(),
    "fp32_partials": CudaFewHeadConfig(stages=3, partial_fp16=False),  # a former default
    "stages3": CudaFewHeadConfig(stages=3),
    "plain_launch": CudaFewHeadConfig(pdl_main=False),  # a former default
}


def variant(spec: str) -> CudaFewHeadConfig:
    """A :data:`VARIANTS` name, or ``field=value[,field=value...]`` over the default config."""
    if spec in VARIANTS:
        return VARIANTS[spec]
    fields = {f.name: f.type for f in dataclasses.fields(CudaFewHeadConfig)}
    changes = {}
    for item in spec.split(","):
        name, _, value = item.partition("=")
        if name not in fields or not value:
            raise argparse.ArgumentTypeError(f"{spec!r}: expected a name of {sorted(VARIANTS)} or field=value pairs "
                                             f"of {sorted(fields)}")
        kind = fields[name]
        changes[name] = (value.lower() in ("1", "true", "yes")) if kind == "bool" else (
            float(value) if kind == "float" else int(value))
    return dataclasses.replace(CudaFewHeadConfig(), **changes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", nargs="+", default=[v for v in VARIANTS if v != "default"],
                    help="variants timed beside the default: names of VARIANTS or field=value,... (default: VARIANTS)")
    ap.add_argument("--json", default="bench/results/fewhead_variants.json", help="write the results here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        print("fewhead_variants: needs a CUDA device of compute capability 8.9 or later", file=sys.stderr)
        return 2
    if not nvrtc.available():
        print("fewhead_variants: needs NVRTC (torch's CUDA wheels ship it)", file=sys.stderr)
        return 2
    try:
        configs = {"default": CudaFewHeadConfig()} | {v: variant(v) for v in args.variants if v != "default"}
    except (argparse.ArgumentTypeError, ValueError) as exc:
        print(f"fewhead_variants: {exc}", file=sys.stderr)
        return 2
    names = list(configs)
    info = device_info()
    gen = torch.Generator(device="cuda").manual_seed(0)
    cache = cache_pool(CONTEXT, "fp8_656", gen)  # first: torch's CUDA context must exist before NVRTC loads
    failed = False
    for name in names:
        cfg = configs[name]
        failures = check(lambda q, c, i, cfg=cfg: decode_fewhead_fp8_cuda(q, c, i, SM_SCALE, config=cfg), cache, gen)
        for line in failures:
            print(f"check FAILED ({name}): {line}", flush=True)
        failed |= bool(failures)
        print(f"{name} ({cfg.label}): {'FAILED' if failures else 'all checks passed against the reference'}",
              flush=True)
    if failed:
        return 1
    rows = []
    for heads, n_q, batch, slots in SHAPES + ((16, 1, 64, "one slot"), (16, 1, 64, "consecutive")):
        q, c, i = shape_inputs(cache, heads, n_q, batch, slots, gen)
        row = {"heads": heads, "queries": n_q, "batch": batch, "slots": slots}
        for name in names:
            cfg = configs[name]
            row[name] = graph_ms(lambda q=q, c=c, i=i, cfg=cfg: decode_fewhead_fp8_cuda(q, c, i, SM_SCALE, config=cfg))
        rows.append(row)
    layers = layer_inputs(cache, 64, 1, 16, gen)
    row = {"heads": 16, "queries": 1, "batch": 64, "slots": "layers"}
    for name in names:
        row[name] = graph_layers_ms([lambda a=a, cfg=configs[name]: decode_fewhead_fp8_cuda(
            a["q"], a["cache"], a["indices"], SM_SCALE, config=cfg) for a in layers])
    rows.append(row)
    result = {"device": info, "date": str(datetime.date.today()),
              "variants": {n: configs[n].label for n in names}, "rows": rows}
    print(f"\n{info['gpu']}, {datetime.date.today()}, k 2048, CUDA-graph ms (ratio to default)\n")
    print("| heads x queries, batch | slots | " + " | ".join(names) + " |")
    print("|---|---|" + "---:|" * len(names))
    for r in rows:
        cells = [f"{r['default']:.4f}"] + [f"{r[n]:.4f} ({r[n] / r['default']:.2f})" for n in names[1:]]
        print(f"| {r['heads']} x {r['queries']}, {r['batch']} | {r['slots']} | " + " | ".join(cells) + " |")
    write_json(args.json, result)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
