"""Probe: the few-head ``fp8_656`` decode on Hopper's FP8 ``wgmma`` (no cached byte converted), against the
production kernel.

    python bench/fewhead_qmma.py [-D NAME=VALUE ...] [--json PATH]   (default bench/results/fewhead_qmma.json)

The production CUDA kernel (``plugins/cuda_hopper/cuda/fewhead_fp8.cu``) converts every e4m3 byte twice to fp16
for ``mma.sync`` (sm_90 has no FP8 ``mma.sync``: ptxas unpacks it). ``bench/fewhead_qmma.cu`` multiplies the bytes
as they are stored with ``wgmma ... e4m3.e4m3``: the rows as the scores' A and V^T as the values' A, both from
registers (``ldmatrix``, plus one byte permute per register for V^T); q and the probabilities are split into two
e4m3 terms each (see the ``.cu`` file). Sm_90a only.

Both kernels run on the inputs of ``bench/fewhead_decode.py`` (k 2048 random slots of each request's own 32K
context) as CUDA-graph replays in one run, after the probe passes the reference backend on the cases of
``bench/fewhead_wgmma.py`` (ragged, empty, wild q, non-power-of-two scales) and a 32-head case. ``-D`` passes
``#define`` overrides (``SCORE_STEPS``, ``LO_ACC``, ``LO_UP``, ``RESCALE_SLACK``, ``REF_SLACK``, ``P_SCALE``,
``NO_MATH``) to the probe; ``--variant`` builds more beside it.

The finding (one H200, 2026-11-27, docs/hopper.md): FP8 ``wgmma`` accumulates in about 14 bits, so the scores
pass the reference's lse tolerance only with the lo products in accumulators of their own, fresh every 32 columns;
that build is 1.3-1.4x slower than the production kernel, and even the imprecise builds are 1.07x slower with real
rows: with 64-row chunks and the one chunk in flight that two CTAs per SM have room for, the gather is the bound.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention_setup import D_QK, PAGE, SM_SCALE, bound  # noqa: E402
from common import graph_ms, write_json  # noqa: E402
from fewhead_wgmma import against_reference, check, hopper_setup, shape_inputs  # noqa: E402

from dsa_runtime.plugins.cuda_hopper.cuda import nvrtc  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.cuda.fewhead_fp8 import (  # noqa: E402
    decode_fewhead_fp8_cuda,
    launch_fewhead_kernel,
)
from dsa_runtime.testing.tolerances import tolerance  # noqa: E402

SOURCE = Path(__file__).with_suffix(".cu")
THREADS, CHUNK, PITCH = 128, 64, 656
SHAPES = ((16, 1, 64, "random"), (16, 1, 64, "all -1"), (16, 1, 64, "consecutive"), (16, 1, 64, "one slot"),
          (8, 1, 64, "random"), (32, 1, 64, "random"), (16, 4, 64, "random"), (16, 1, 1, "random"),
          (16, 1, 128, "random"))


def smem_bytes(stages: int) -> int:
    """The ``.cu`` file's layout: q and P' tiles (26,624 B), the ring, biases, exchange, flags, 1 KB alignment."""
    return 26624 + stages * CHUNK * PITCH + stages * CHUNK * 4 + 512 + 16 + 1024


class Probe:
    """The compiled probe kernel and its launch (``defines``: ``NAME=VALUE`` overrides)."""

    def __init__(self, defines: tuple[str, ...] = ()) -> None:
        stages = next((int(d.split("=")[1]) for d in defines if d.startswith("STAGES=")), 2)
        self.smem = smem_bytes(stages)
        self.kernel = nvrtc.load_kernel(SOURCE.read_text(), "fewhead_qmma_decode", tuple(f"-D{d}" for d in defines),
                                        self.smem, torch.device("cuda"), arch_suffix="a")

    def __call__(self, q: torch.Tensor, cache: torch.Tensor, indices: torch.Tensor, merge: bool = True):
        """``q`` ``[B, Q, H, 576]`` bf16 (H <= 16 or 32), ``cache`` ``[pages, 64, 656]`` uint8, ``indices``
        ``[B, Q, K]`` int32 -> ``out`` ``[B, Q, H, 512]`` bf16, ``lse`` ``[B, Q, H]``: the production kernel's host
        side (the probe takes the same arguments), fp16 partials, 128 rows a slice at least."""
        return launch_fewhead_kernel(self.kernel, THREADS, CHUNK, q, cache, indices, SM_SCALE, merge=merge)


def check_32_heads(probe: Probe, cache: torch.Tensor, gen: torch.Generator) -> list[str]:
    """Two head groups (32 heads) against the reference backend."""
    ref = bound("reference", "sparse_attn.decode", "fp8_656", {"heads": 32, "k": 2048, "page_size": PAGE})[0]
    failures = []
    for batch, n_q, k in ((9, 1, 2048), (2, 2, 500)):
        idx = torch.randint(0, cache.shape[0] * PAGE, (batch, n_q, k), device="cuda", generator=gen)
        idx = torch.where(torch.rand(batch, n_q, k, device="cuda", generator=gen) < 0.05, -1, idx).to(torch.int32)
        q = torch.randn(batch, n_q, 32, D_QK, device="cuda", generator=gen, dtype=torch.bfloat16)
        problem = against_reference(probe, ref, q, cache, idx)
        if problem:
            failures.append(f"32 heads, batch {batch} x {n_q}, k {k}: {problem}")
    return failures


def worst_error(probe: Probe, cache: torch.Tensor, gen: torch.Generator, draws: int = 6,
                exact_q: bool = False) -> dict:
    """Largest ``|got - want| / (atol + rtol |want|)`` of ``out`` and of ``lse`` over ``draws`` draws (16 heads,
    batch 64), for the probe and the production kernel: 1 is the kit's tolerance. ``exact_q``: q's latent values
    are multiples of 1/4 in [-7/4, 7/4] (three significant bits: exact in one e4m3 term, so the probe's lo term is
    zero and what error is left comes from the products' sums alone)."""
    ref = bound("reference", "sparse_attn.decode", "fp8_656", {"heads": 16, "k": 2048, "page_size": PAGE})[0]
    tols = {"out": tolerance("sparse_attn.out"), "lse": tolerance("sparse_attn.lse")}
    worst = {f"{name} {part}": 0.0 for name in ("probe", "production") for part in tols}
    for _ in range(draws):
        idx = torch.randint(0, cache.shape[0] * PAGE, (64, 1, 2048), device="cuda", generator=gen).to(torch.int32)
        q = torch.randn(64, 1, 16, D_QK, device="cuda", generator=gen, dtype=torch.bfloat16)
        if exact_q:
            q[..., :512] = torch.randint(-7, 8, (64, 1, 16, 512), device="cuda", generator=gen).to(q.dtype) / 4
        want = ref(q, cache, idx, SM_SCALE, layout="fp8_656")
        for name, got in (("probe", probe(q, cache, idx)), ("production", decode_fewhead_fp8_cuda(q, cache, idx,
                                                                                                    SM_SCALE))):
            for i, (part, tol) in enumerate(tols.items()):
                g, w = got[i].float(), want[i].float()
                ratio = ((g - w).abs() / (tol.atol + tol.rtol * w.abs())).max().item()
                worst[f"{name} {part}"] = max(worst[f"{name} {part}"], ratio)
    return worst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-D", dest="defines", action="append", default=[], help="NAME=VALUE #define override")
    ap.add_argument("--variant", action="append", default=[],
                    help="another probe build beside the first: NAME=VALUE[,NAME=VALUE...] (repeatable)")
    ap.add_argument("--no-check", action="store_true", help="time without the checks (diagnostic builds)")
    ap.add_argument("--json", default="bench/results/fewhead_qmma.json", help="write the results here")
    args = ap.parse_args(argv)
    setup = hopper_setup("fewhead_qmma")
    if setup is None:
        return 2
    info, gen, cache = setup
    builds = [tuple(args.defines)] + [tuple(args.defines) + tuple(v.split(",")) for v in args.variant]
    probes, labels, errors = [], [], []
    for defines in builds:
        probe = Probe(defines)
        label = ",".join(defines) or "default"
        print(f"{info['gpu']}: probe [{label}] {probe.kernel.registers} registers, {probe.kernel.local_bytes} B local, "
              f"{probe.smem} B shared, {probe.kernel.resident_blocks(THREADS)} CTAs / SM", flush=True)
        if args.no_check:
            probes.append(probe)
            labels.append(label + " (unchecked)")
            continue
        failures = check(probe, cache, gen) + check_32_heads(probe, cache, gen)
        for line in failures:
            print(f"check FAILED [{label}]:", line[:700], flush=True)
        worst = worst_error(probe, cache, gen)
        print("  worst |error| / tolerance over 6 draws (16 heads, batch 64): "
              + ", ".join(f"{k} {v:.2f}" for k, v in worst.items())
              + (f"; {len(failures)} of 16 checks FAILED" if failures else "; all 16 checks passed"), flush=True)
        exact = worst_error(probe, cache, gen, exact_q=True)
        print("  the same with e4m3-exact q (no lo term): "
              + ", ".join(f"{k} {v:.2f}" for k, v in exact.items()), flush=True)
        worst["exact q"] = exact
        probes.append(probe)
        labels.append(label + ("" if not failures else " (FAILED)"))
        errors.append(worst)
    rows = []
    for heads, n_q, batch, slots in SHAPES:
        q, c, i = shape_inputs(cache, heads, n_q, batch, slots, gen)
        row = {"heads": heads, "queries": n_q, "batch": batch, "slots": slots,
               "cuda_ms": graph_ms(lambda q=q, c=c, i=i: decode_fewhead_fp8_cuda(q, c, i, SM_SCALE))}
        row["probe_ms"] = [graph_ms(lambda q=q, c=c, i=i, p=p: p(q, c, i)) for p in probes]
        row["probe_no_merge_ms"] = graph_ms(lambda q=q, c=c, i=i: probes[0](q, c, i, merge=False))
        rows.append(row)
    result = {"device": info, "date": str(datetime.date.today()), "builds": labels, "errors": errors, "rows": rows}
    print(f"\n{info['gpu']}, {datetime.date.today()}, k 2048, CUDA-graph ms; probe builds: "
          + "; ".join(f"[{i}] {lab}" for i, lab in enumerate(labels)) + "\n")
    print("| heads x queries, batch | slots | production (mma.sync) | "
          + " | ".join(f"probe [{i}]" for i in range(len(probes))) + " | probe [0], no merge |")
    print("|---|---|---:|" + "---:|" * len(probes) + "---:|")
    for r in rows:
        cells = " | ".join(f"{ms:.4f} ({ms / r['cuda_ms']:.2f})" for ms in r["probe_ms"])
        print(f"| {r['heads']} x {r['queries']}, {r['batch']} | {r['slots']} | {r['cuda_ms']:.4f} | {cells} | "
              f"{r['probe_no_merge_ms']:.4f} |")
    write_json(args.json, result)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
