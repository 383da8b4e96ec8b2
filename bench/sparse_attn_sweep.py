"""One-GPU-call sweep of every sparse MLA candidate: bf16 prefill, bf16 paged decode and fp8_656
decode at V3.2 sizes, each candidate checked against the reference on CUDA (a few rows) and then timed.

Shapes: prefill 4096 queries x 8192 keys, 128 heads, k 2048; bf16 decode batch 1/64/128 at 128 heads and batch 64
at 16 heads (32K context, page 64); fp8 decode batch 1/64/128 at 128 heads. Prints TFLOP/s
(``2 * H * (576 + 512) * K`` per query), the % of the bf16 matmul rate measured in the same run and the ratio to
plain PyTorch (gather + two einsums, bf16, timed once per shape), then the best candidate per shape. A candidate
that fails to compile (shared memory, registers) or to match the reference is reported and skipped.

    python bench/sparse_attn_triton.py --sweep [--out bench/results/sparse_attn_sweep.json]
"""

from __future__ import annotations

import datetime
import time

import torch
from common import bench_ms, device_info, graph_ms, write_json

from dsa_runtime.plugins.cuda_hopper.triton.mla_fp8_decode import DecodeConfig, decode_fp8_656
from dsa_runtime.plugins.cuda_hopper.triton.mla_fp8_decode import default_config as fp8_default
from dsa_runtime.plugins.cuda_hopper.triton.sparse_attn_candidates import BF16_CANDIDATES, FP8_CANDIDATES
from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_decode_bf16 import decode_bf16
from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_prefill import default_config, sparse_mla_forward
from dsa_runtime.reference.kv_quant import ReferenceKVQuant
from dsa_runtime.reference.sparse_attn import ReferenceSparseAttn
from dsa_runtime.testing.compare import out_and_lse
from dsa_runtime.testing.tolerances import tolerance

SCALE, PAGE = 0.135234, 64
REF = ReferenceSparseAttn()
# The GPU shapes; --dry-run (CPU, TRITON_INTERPRET=1) shrinks them to check this script itself before the GPU run.
DEV, K, CTX, T_PRE, S_PRE, BATCHES, MAX_CANDIDATES = "cuda", 2048, 32768, 4096, 8192, (1, 64, 128), 99


def dry_run_sizes() -> None:
    """Tiny shapes on the CPU (run under TRITON_INTERPRET=1): the script's plumbing, not its timings."""
    global DEV, K, CTX, T_PRE, S_PRE, BATCHES, MAX_CANDIDATES
    DEV, K, CTX, T_PRE, S_PRE, BATCHES, MAX_CANDIDATES = "cpu", 64, 256, 32, 256, (1, 2, 3), 1


def timed_ms(fn, slow: bool = False) -> float:
    if DEV != "cuda":
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    return bench_ms(fn, slow=slow)


def torch_sparse_mla(q: torch.Tensor, rows: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch: gather the selected rows, two bf16 einsums, fp32 softmax. q [T, H, 576], rows [S, 576]."""
    kv = rows[idx.clamp(min=0).long()]  # [T, K, 576]
    s = torch.einsum("thd,tkd->thk", q, kv).float() * SCALE
    s = s.masked_fill((idx < 0)[:, None, :], float("-inf"))
    return torch.einsum("thk,tkd->thd", torch.softmax(s, -1).bfloat16(), kv[..., :512])


def prefill_inputs(gen):
    q = torch.randn(T_PRE, 128, 576, device=DEV, generator=gen).bfloat16()
    kv = torch.randn(S_PRE, 576, device=DEV, generator=gen).bfloat16()
    idx = torch.rand(T_PRE, S_PRE, device=DEV, generator=gen).argsort(dim=1)[:, :K].to(torch.int32)
    idx[::7, -K // 20:] = -1
    return q, kv, idx


def decode_slots(batch: int, gen) -> torch.Tensor:
    """Per request ``K`` distinct slots of its own 32K-token range of pages in a shuffled page table."""
    pages_per = CTX // PAGE
    table = torch.randperm(batch * pages_per, device=DEV, generator=gen).view(batch, pages_per)
    pos = torch.rand(batch, CTX, device=DEV, generator=gen).argsort(dim=1)[:, :K]
    return (torch.gather(table, 1, pos // PAGE) * PAGE + pos % PAGE).to(torch.int32).view(batch, 1, K)


def fp8_cache(n_slots: int, gen) -> torch.Tensor:
    """Unit-scale latent rows quantized by the reference (power-of-two scales), as the engine stores them."""
    c = torch.randn(n_slots, 512, device=DEV, generator=gen).bfloat16()
    k_pe = torch.randn(n_slots, 64, device=DEV, generator=gen).bfloat16()
    return ReferenceKVQuant().quantize_mla(c, k_pe, layout="fp8_656")  # [n_slots, 656]


class Sweep:
    def __init__(self, ceiling: float, budget_s: float) -> None:
        self.ceiling, self.rows, self.deadline = ceiling, [], time.monotonic() + budget_s

    def run(self, shape: str, label: str, fn, n_flops: int, torch_ms: float, check=None, graph=False,
            config=None) -> None:
        row = {"shape": shape, "label": label, "config": repr(config)}
        if time.monotonic() > self.deadline:
            row["error"] = "skipped: sweep time budget spent"
            print(f"  {label:40s} skipped (time budget)", flush=True)
            self.rows.append(row)
            return
        try:
            start = time.perf_counter()
            got = fn()
            first_ms = (time.perf_counter() - start) * 1e3
            if check is not None and (msg := check(got)):
                raise AssertionError(f"wrong result: {msg[:200]}")
            ms = timed_ms(fn) if DEV == "cuda" else first_ms  # the dry run's interpreter: one call says enough
            g_ms = graph_ms(fn) if graph and DEV == "cuda" else float("nan")
        except Exception as exc:  # noqa: BLE001 - compile failures, OOM of shared memory: a result, not a crash
            row["error"] = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            print(f"  {label:40s} FAILED {row['error']}", flush=True)
            self.rows.append(row)
            return
        best = min(ms, g_ms) if g_ms == g_ms else ms
        tf = n_flops / best / 1e9
        row.update(us=ms * 1e3, graph_us=g_ms * 1e3, tflops=tf, pct_matmul=100 * tf / self.ceiling,
                   x_torch=torch_ms / best)
        print(f"  {label:40s} {ms * 1e3:9.1f} us graph {g_ms * 1e3:9.1f} us {tf:6.1f} TFLOP/s "
              f"{row['pct_matmul']:5.1f}% mm {row['x_torch']:5.2f}x torch", flush=True)
        self.rows.append(row)


def _checker(want):
    out_tol, lse_tol = tolerance("sparse_attn.out"), tolerance("sparse_attn.lse")
    return lambda got, sub: out_and_lse(got[0][sub].float(), got[1][sub], want[0].float(), want[1], out_tol, lse_tol)


def sweep_prefill(sw: Sweep, gen) -> None:
    q, kv, idx = prefill_inputs(gen)
    sub = slice(0, T_PRE, T_PRE // 16)
    chk = _checker(REF.prefill(q[sub], kv, idx[sub], SCALE))
    part = T_PRE // 8  # an eighth of the rows at a time: the gathered [T, K, 576] tensor is large
    t_ms = timed_ms(lambda: torch_sparse_mla(q[:part], kv, idx[:part]), slow=True) * 8
    print(f"prefill {T_PRE} x {S_PRE} keys, 128 heads, k {K}: torch gather+einsum {t_ms:.2f} ms", flush=True)
    default = default_config(128, torch.bfloat16)
    for cfg in list(dict.fromkeys([default, *BF16_CANDIDATES["prefill"]]))[:MAX_CANDIDATES]:
        sw.run("prefill", cfg.label() + (" (default)" if cfg == default else ""),
               lambda cfg=cfg: sparse_mla_forward(q, kv, idx, SCALE, config=cfg), 2 * T_PRE * 128 * 1088 * K, t_ms,
               check=lambda got: chk(got, sub), config=cfg)


def sweep_decode(sw: Sweep, gen, layout: str, batch: int, heads: int, configs: list, fp8_rows=None) -> None:
    shape = f"{layout} decode b{batch} h{heads}"
    slots = decode_slots(batch, gen)
    q = torch.randn(batch, 1, heads, 576, device=DEV, generator=gen).bfloat16()
    if layout == "bf16":
        cache = torch.randn(batch * CTX // PAGE, PAGE, 576, device=DEV, generator=gen).bfloat16()
        flat = cache.view(-1, 576)
    else:
        cache = fp8_rows[: batch * CTX].view(-1, PAGE, 656)
    sub = slice(0, batch, max(1, batch // 4))
    chk = _checker(REF.decode(q[sub], cache, slots[sub], SCALE, layout=layout))
    if layout == "bf16":
        t_ms = timed_ms(lambda: torch_sparse_mla(q[:, 0], flat, slots[:, 0]), slow=True)
    else:  # torch on the fp8 cache: gather + dequantize + the same einsums
        t_ms = timed_ms(lambda: torch_sparse_mla(
            q[:, 0], ReferenceKVQuant().dequantize_mla(cache.view(-1, 656)[slots.view(-1).long()],
                                                      layout="fp8_656").bfloat16(),
            torch.arange(batch * K, device=DEV, dtype=torch.int32).view(batch, K)), slow=True)
    print(f"{shape}: torch {t_ms * 1e3:.1f} us", flush=True)
    n_flops = 2 * batch * heads * 1088 * K
    for cfg, splits in configs[:MAX_CANDIDATES]:
        if layout == "bf16":
            fn = lambda cfg=cfg, n=splits: decode_bf16(q, cache, slots, SCALE, config=cfg, num_splits=n)  # noqa: E731
            label = f"{cfg.label()} splits {splits or 'auto'}"
        else:
            fn = lambda cfg=cfg: decode_fp8_656(q, cache, slots, SCALE, config=cfg)  # noqa: E731
            label = f"h{cfg.block_h}_n{cfg.block_n}_w{cfg.num_warps}_s{cfg.num_stages}_{cfg.variant} " \
                    f"splits {cfg.splits or 'auto'}"
        sw.run(shape, label, fn, n_flops, t_ms, check=lambda got: chk(got, sub), graph=True,
               config=cfg if splits is None else None)  # only planned-split rows can become a default


def main(out: str, budget_s: float = 240.0, dry_run: bool = False) -> int:
    if dry_run:
        dry_run_sizes()
        ceiling, info = 1.0, {"gpu": "cpu (dry run: interpreter, tiny shapes)"}
        gen = torch.Generator().manual_seed(0)
    else:
        gen = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(8192, 8192, device="cuda").bfloat16()
        ceiling = 2 * 8192**3 / bench_ms(lambda: a @ a) / 1e9
        info = device_info()
    print(info, f"bf16 matmul 8192^3 {ceiling:.1f} TFLOP/s", flush=True)
    sw = Sweep(ceiling, budget_s)
    b_one, b_mid, b_big = BATCHES
    h128, h16 = BF16_CANDIDATES["decode_h128"], BF16_CANDIDATES["decode_h16"]
    d128, d16 = default_config(128, torch.bfloat16, "decode"), default_config(16, torch.bfloat16, "decode")
    bf16_128 = [(c, None) for c in dict.fromkeys([d128, *h128])]
    b1 = [(c, n) for c in dict.fromkeys([d128, *BF16_CANDIDATES["decode_h128_b1"]]) for n in (None, 4, 8, 32)]
    f128 = list(dict.fromkeys([fp8_default(128), *FP8_CANDIDATES["decode_h128"]]))
    f1 = [DecodeConfig(c.block_h, c.block_n, c.num_warps, c.num_stages, n, c.variant)
          for c in f128[:3] for n in (0, 4, 8, 32)]
    fp8_rows: dict[str, torch.Tensor] = {}

    def fp8(batch: int, configs: list) -> None:
        if "rows" not in fp8_rows:
            fp8_rows["rows"] = fp8_cache(b_big * CTX, gen)
        sweep_decode(sw, gen, "fp8_656", batch, 128, [(c, None) for c in configs], fp8_rows["rows"])

    steps = [  # most important shapes first: a spent time budget skips only what comes last
        ("prefill", lambda: sweep_prefill(sw, gen)),
        ("bf16 b64 h128", lambda: sweep_decode(sw, gen, "bf16", b_mid, 128, bf16_128)),
        ("fp8 b64", lambda: fp8(b_mid, f128)),
        ("fp8 b128", lambda: fp8(b_big, f128)),
        ("fp8 b1", lambda: fp8(b_one, list(dict.fromkeys(f1)))),
        ("bf16 b128 h128", lambda: (fp8_rows.clear(), sweep_decode(sw, gen, "bf16", b_big, 128, bf16_128))),
        ("bf16 b1 h128", lambda: sweep_decode(sw, gen, "bf16", b_one, 128, b1)),
        ("bf16 b64 h16", lambda: sweep_decode(sw, gen, "bf16", b_mid, 16, [(c, None) for c in dict.fromkeys([d16, *h16])])),
    ]
    best: dict[str, dict] = {}
    for name, step in steps:
        try:  # a shape that fails as a whole (memory, a sticky CUDA error) leaves the others and the JSON
            step()
        except Exception as exc:  # noqa: BLE001
            msg = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            print(f"{name}: FAILED {msg}", flush=True)
            sw.rows.append({"shape": name, "label": "(whole shape)", "error": msg})
        torch.cuda.empty_cache()
        best = {}
        for r in sw.rows:
            if "tflops" in r and (r["shape"] not in best or r["tflops"] > best[r["shape"]]["tflops"]):
                best[r["shape"]] = r
        write_json(out, {"device": info, "matmul_tflops": ceiling, "rows": sw.rows, "best": best,
                         "when": datetime.datetime.now(datetime.timezone.utc).isoformat()})
    print(f"\nbest per shape (bf16 matmul {ceiling:.1f} TFLOP/s on {info['gpu']}):")
    for shape, r in best.items():
        us = min(r["us"], r["graph_us"]) if r["graph_us"] == r["graph_us"] else r["us"]
        print(f"  {shape:24s} {r['label']:40s} {us:9.1f} us {r['tflops']:6.1f} TFLOP/s {r['pct_matmul']:5.1f}% "
              f"{r['x_torch']:5.2f}x torch")
    flips = {"prefill": "BF16_DEFAULTS['prefill'][64]", f"bf16 decode b{b_mid} h128": "BF16_DEFAULTS['decode'][64]",
             f"bf16 decode b{b_mid} h16": "BF16_DEFAULTS['decode'][16]", f"fp8_656 decode b{b_mid} h128": "FP8_DEFAULTS[64]"}
    print("\nto adopt the winners, in plugins/cuda_hopper/triton/sparse_attn_candidates.py:")
    for shape, entry in flips.items():
        rows = [r for r in sw.rows if r["shape"] == shape and "tflops" in r and r.get("config") not in (None, "None")]
        rows = [r for r in rows if "splits=0" in r["config"] or "AttnConfig" in r["config"]]  # planned splits only
        if rows:
            print(f"  {entry} = {max(rows, key=lambda r: r['tflops'])['config']}")
    print(f"wrote {out}")
    return 0
