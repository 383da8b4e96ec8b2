"""tp N against tp 1 on the tiny V3.2 preset: next-token top-1 agreement, indexer top-k flips, logits diff.

Random weights (``rank_random_state``, seed 0: every rank draws the same full tensors and keeps its slices,
so tp N is exactly the tp 1 model split), CPU and gloo. One ragged prefill of ``--prompts`` prompts of
``--min-len`` .. ``--max-len`` random tokens (``logits="all"``), then ``--decode-steps`` decodes fed with
tp 1's greedy tokens (both degrees decode the same sequence). Reported:

* ``top1_next``: agreement of the argmax of each prompt's last prefill row (the next token) and of every
  decode step's logits; ``top1_rows``: over every prefill row;
* ``max_abs_diff`` / ``mean_abs_diff`` of the logits (prefill rows and decodes);
* ``topk_rows_differ``: fraction of indexer top-k rows (per layer call, rank 0's group) whose selected key
  set differs from tp 1's. Under DP attention group g runs only its own sequences, so group 0's calls are
  compared with a tp 1 run of group 0's sequences alone (logits are compared with the whole-batch run).

Usage: ``python bench/tp_topk_flips.py [--tp 2] [--dp 1] [--dtype bfloat16] [--reduce-dtype fp32]
[--prompts 16] [--min-len 128] [--max-len 256] [--decode-steps 4] [--index-topk 32] [--out f.json]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
PAGE = 16


def prompts(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(0, vocab, (m,), generator=g).tolist() for m in lens]


def tables(ps: list[list[int]], extra: int) -> tuple[list[list[int]], int]:
    """Disjoint page tables (never page 0) covering each prompt plus ``extra`` tokens; and the page count."""
    out, nxt = [], 1
    for p in ps:
        n = -(-(len(p) + extra) // PAGE)
        out.append(list(range(nxt, nxt + n)))
        nxt += n
    return out, nxt


def drive(runner, ps, tabs, feed: list[list[int]] | None, steps: int):
    """Prefill (all rows' logits) then ``steps`` decodes; tokens fed from ``feed`` (else greedy).
    Returns (prefill logits per prompt, decode logits ``[steps, n, V]``, fed tokens per prompt)."""
    from dsa_runtime.model.seqs import ForwardBatch, ForwardSeq, forward

    pre = forward(runner, ForwardBatch([ForwardSeq(p, 0, t, "all") for p, t in zip(ps, tabs, strict=True)]))
    pre = [o.float().cpu() for o in pre]
    fed = feed or [[int(o[-1].argmax())] for o in pre]
    lengths = [len(p) for p in ps]
    dec = []
    for s in range(steps):
        seqs = [ForwardSeq([f[s]], n, t, "last") for f, n, t in zip(fed, lengths, tabs, strict=True)]
        out = torch.stack([o.float().cpu() for o in forward(runner, ForwardBatch(seqs))])
        dec.append(out)
        if feed is None:
            for f, o in zip(fed, out, strict=True):
                f.append(int(o.argmax()))
        lengths = [n + 1 for n in lengths]
    return pre, (torch.stack(dec) if dec else None), fed


def topk_flips(a_log: list, b_log: list) -> tuple[int, int, bool]:
    """(rows whose key set differs, rows compared, call structure equal) over matching calls."""
    same = len(a_log) == len(b_log) and all(a.shape == b.shape for a, b in zip(a_log, b_log, strict=False))
    rows = differ = 0
    for a, b in zip(a_log, b_log, strict=False):
        if a.shape != b.shape:
            continue
        sa, _ = a.sort(-1)
        sb, _ = b.sort(-1)
        differ += int((sa != sb).any(-1).sum())
        rows += a.shape[0]
    return differ, rows, same


def measure(args) -> dict:
    from dsa_runtime.cache import KVCache
    from dsa_runtime.distributed import ParallelConfig, RankInfo
    from dsa_runtime.distributed.dp import split_batch
    from dsa_runtime.distributed.random_weights import rank_random_state
    from dsa_runtime.distributed.runtime import DistributedRunner
    from dsa_runtime.distributed.worker import RankSpec
    from dsa_runtime.loader.presets import preset_config
    from dsa_runtime.model.config import ModelConfig
    from dsa_runtime.model.runner import ModelRunner, kernel_needs
    from dsa_runtime.model.seqs import ForwardBatch, ForwardSeq
    from dsa_runtime.resolve import KernelConfig, resolve_kernels
    from tests.distributed import hooks

    torch.set_num_threads(1)
    hf = preset_config("tiny-v32")
    hf.pop("quantization_config", None)
    hf["num_nextn_predict_layers"] = 0
    cfg = dataclasses.replace(ModelConfig.from_hf(hf), index_topk=args.index_topk)
    ps = prompts(args.prompts, args.min_len, args.max_len, cfg.vocab_size, args.seed)
    tabs, num_pages = tables(ps, args.decode_steps + 1)
    kcfg = KernelConfig(platform="cpu")
    dtype = getattr(torch, args.dtype)

    def reference():
        kernels = resolve_kernels(kcfg, needs=kernel_needs(cfg, PAGE))
        r = ModelRunner(cfg, rank_random_state(cfg, RankInfo(0, 1, 1, 1), "cpu", seed=0), kernels=kernels,
                        cache=KVCache(cfg, num_pages, PAGE, kernels.kv_layout, "cpu", dtype), dtype=dtype,
                        moe_fp32_sum=args.tp1_moe_fp32)
        hooks.record_topk(r)
        return r

    t0 = time.perf_counter()
    ref = reference()
    want_pre, want_dec, fed = drive(ref, ps, tabs, None, args.decode_steps)
    ref_log = ref.topk_log
    if args.dp > 1:  # group 0 serves only its sequences: its top-k calls line up with a run of those alone
        mine = split_batch(ForwardBatch([ForwardSeq(p, 0, t) for p, t in zip(ps, tabs, strict=True)]), args.dp)[0]
        ref0 = reference()
        g0_pre, g0_dec, _ = drive(ref0, [ps[i] for i in mine], [tabs[i] for i in mine], [fed[i] for i in mine],
                                  args.decode_steps)
        ref_log = ref0.topk_log
    t_ref = time.perf_counter() - t0
    spec = RankSpec(config=cfg, random_seed=0, dtype=args.dtype, num_pages=num_pages, page_size=PAGE,
                    kernel_config=kcfg, hooks=["tests.distributed.hooks:record_topk"])
    parallel = ParallelConfig(tp=args.tp, dp=args.dp, enable_dp_attention=args.dp > 1, timeout_s=600,
                              reduce_dtype=args.reduce_dtype)
    runner = DistributedRunner(parallel, spec)
    try:
        t0 = time.perf_counter()
        got_pre, got_dec, _ = drive(runner, ps, tabs, fed, args.decode_steps)
        t_tp = time.perf_counter() - t0
        differ, rows, same = topk_flips(ref_log, runner.runner.topk_log)
    finally:
        runner.shutdown()
    last_a = torch.stack([o[-1] for o in want_pre])
    last_b = torch.stack([o[-1] for o in got_pre])
    rows_a, rows_b = torch.cat(want_pre), torch.cat(got_pre)
    nxt_a, nxt_b = [last_a.argmax(-1)], [last_b.argmax(-1)]
    diffs = [(rows_a - rows_b).abs()]
    if want_dec is not None:
        nxt_a.append(want_dec.argmax(-1).flatten())
        nxt_b.append(got_dec.argmax(-1).flatten())
        diffs.append((want_dec - got_dec).abs().flatten(0, 1))
    agree = torch.cat(nxt_a) == torch.cat(nxt_b)
    d = torch.cat(diffs)
    extra = {}
    if args.dp > 1:
        # Control: tp 1 itself on group 0's sequences alone vs in the whole batch (CPU paths depend on row
        # counts, e.g. few-row fp32 GEMMs), and tp N's group 0 against that same-batch tp 1 run.
        def nxt(pre, dec, idx):
            last = torch.stack([pre[i][-1] for i in idx]).argmax(-1)
            return torch.cat([last, dec[:, idx].argmax(-1).flatten()]) if dec is not None else last

        g = list(range(len(mine)))
        whole, alone, tpn = nxt(want_pre, want_dec, mine), nxt(g0_pre, g0_dec, g), nxt(got_pre, got_dec, mine)
        extra = {"group0_tp1_alone_vs_whole_top1": float((whole == alone).float().mean()),
                 "group0_tpN_vs_tp1_alone_top1": float((tpn == alone).float().mean())}
    return {**extra,
        "tp": args.tp, "dp": args.dp, "dtype": args.dtype, "reduce_dtype": args.reduce_dtype,
        "tp1_moe_fp32": bool(args.tp1_moe_fp32),
        "index_topk": args.index_topk, "prompts": args.prompts, "lengths": [len(p) for p in ps],
        "decode_steps": args.decode_steps,
        "top1_prefill_next": float((last_a.argmax(-1) == last_b.argmax(-1)).float().mean()),
        "top1_next": float(agree.float().mean()), "next_compared": int(agree.numel()),
        "top1_rows": float((rows_a.argmax(-1) == rows_b.argmax(-1)).float().mean()),
        "max_abs_diff": float(d.max()), "mean_abs_diff": float(d.mean()), "logit_scale": float(rows_a.abs().mean()),
        "topk_rows_differ": differ / max(rows, 1), "topk_rows": rows, "topk_calls_aligned": same,
        "seconds": {"tp1": round(t_ref, 1), "tpN": round(t_tp, 1)},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--reduce-dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--tp1-moe-fp32", type=int, default=1, choices=(0, 1),
                   help="1: tp 1 rounds the MoE's fp32 expert sum once (ModelRunner moe_fp32_sum), as TP ranks do")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--min-len", type=int, default=128)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--decode-steps", type=int, default=4)
    p.add_argument("--index-topk", type=int, default=32)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    res = measure(args)
    print(json.dumps(res))
    if args.out:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from common import write_json

        write_json(args.out, res)
    print(f"tp {res['tp']} dp {res['dp']} {res['dtype']} reduce {res['reduce_dtype']}: next-token top-1 "
          f"{res['top1_next']:.4f} ({res['next_compared']}), all prefill rows {res['top1_rows']:.4f}, max |diff| "
          f"{res['max_abs_diff']:.4f} (mean {res['mean_abs_diff']:.5f}, scale {res['logit_scale']:.2f}), "
          f"top-k rows differing {res['topk_rows_differ']:.4f} of {res['topk_rows']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
