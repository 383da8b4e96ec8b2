"""One layer of V3.2's DSA decode path at long context against dense MLA decode, with IndexCache (issue 24).

    python bench/dsa_decode_path.py [--batch 64] [--context 131072] [--freq 4] [--json PATH]

Times, as CUDA-graph replays in one run on one GPU, with the kernels the engine resolves by default:

* ``indexer``: ``indexer.logits_paged`` (64 heads x 128, FP8) of one query per request over its whole context
  in the paged index-K cache (132 B / token), with its share of the copy bandwidth;
* ``topk``: ``topk.topk_transform`` (top-2048 + page-table transform) of those logits;
* ``sparse``: ``sparse_attn.decode`` (128 heads, k 2048) over an ``fp8_656`` cache;
* ``dense``: our dense path (the V3 family's): ``sparse_attn.decode`` over a bf16 cache with every cached slot of
  the request as its index set, i.e. dense bf16 MLA decode, beside the time to read that cache at copy speed.

Then the DSA path per layer, ``indexer + topk + sparse``, and with IndexCache ``index_topk_freq`` N averaged
over N layers (one Full layer runs all three, N - 1 Shared ones only the sparse decode): ``sparse + (indexer +
topk) / N``, each as a speed-up over ``dense``. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention_setup import D_QK, PAGE, SM_SCALE, fp8_cache  # noqa: E402
from common import copy_ceiling_gbs, device_info, graph_ms, write_json  # noqa: E402
from selection_setup import decode_inputs as index_inputs  # noqa: E402

from dsa_runtime.resolve import KernelConfig, resolve_kernels  # noqa: E402

HEADS, INDEX_HEADS, TOPK = 128, 64, 2048


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--freq", type=int, default=4, help="index_topk_freq of the IndexCache row")
    ap.add_argument("--json", default="bench/results/dsa_decode_path.json")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("dsa_decode_path.py needs a CUDA device")
    b, ctx = args.batch, args.context
    gen = torch.Generator(device="cuda").manual_seed(0)
    needs = {"heads": HEADS, "k": TOPK, "page_size": PAGE, "decode_queries": 1, "index_heads": INDEX_HEADS,
             "scale_fmt": "ue8m0"}
    sparse_k = resolve_kernels(KernelConfig(kv_layout="fp8_656"), needs=needs)
    dense_k = resolve_kernels(KernelConfig(kv_layout="bf16"), needs={"heads": HEADS, "page_size": PAGE,
                                                                     "decode_queries": 1})
    chosen = {m: c.backend for m, c in sparse_k.choices.items() if m in (
        "indexer.logits_paged", "topk.topk_transform", "sparse_attn.decode")}
    chosen["dense sparse_attn.decode"] = dense_k.choices["sparse_attn.decode"].backend
    print(f"{device_info()['gpu']}: batch {b}, context {ctx}; kernels {chosen}", flush=True)

    # Indexer + top-k over the paged index-K cache (shuffled pages).
    ix = index_inputs(b, ctx, 1, gen)
    starts = torch.zeros(b, dtype=torch.int32, device="cuda")
    rows = torch.arange(b, dtype=torch.int32, device="cuda")
    logits = sparse_k.indexer.logits_paged(ix["q8"], ix["w"], ix["cache"], ix["lens"], ix["table"], ix["max_len"])

    def indexer():
        return sparse_k.indexer.logits_paged(ix["q8"], ix["w"], ix["cache"], ix["lens"], ix["table"], ix["max_len"])

    def topk():
        return sparse_k.topk.topk_transform(logits, starts, ix["lens"], TOPK, ix["table"], rows, PAGE)

    picked = topk()
    assert picked.shape == (b, TOPK) and int((picked >= 0).sum(1).min()) == TOPK
    t_index, t_topk = graph_ms(indexer), graph_ms(topk)

    # FP8 sparse decode over the selected slots (indices into a cache of b * ctx rows).
    cache8 = fp8_cache(b * ctx, gen)
    q = torch.randn(b, 1, HEADS, D_QK, device="cuda", generator=gen, dtype=torch.bfloat16)
    indices = picked.to(torch.int32).clamp_max(b * ctx - 1)[:, None, :]

    def sparse():
        return sparse_k.sparse_attn.decode(q, cache8, indices, SM_SCALE, layout="fp8_656")

    t_sparse = graph_ms(sparse)

    # Dense bf16 MLA decode: every slot of the request's context, over a bf16 cache.
    cache16 = torch.randn(b * ctx // PAGE, PAGE, D_QK, device="cuda", generator=gen, dtype=torch.bfloat16)
    dense_idx = (torch.arange(b, device="cuda")[:, None] * ctx + torch.arange(ctx, device="cuda")[None, :])
    dense_idx = dense_idx.to(torch.int32)[:, None, :]

    def dense():
        return dense_k.sparse_attn.decode(q, cache16, dense_idx, SM_SCALE, layout="bf16")

    t_dense = graph_ms(dense)
    copy = copy_ceiling_gbs()
    dense_bytes = b * ctx * D_QK * 2
    index_bytes = b * ctx * 132
    full = t_index + t_topk + t_sparse
    shared = t_sparse + (t_index + t_topk) / args.freq
    rows_out = [
        ("indexer logits (paged)", t_index, f"{index_bytes / t_index / 1e6 / copy:.1%} of copy"),
        ("top-2048 + transform", t_topk, ""),
        ("FP8 sparse decode, 128 heads", t_sparse, ""),
        ("dense bf16 MLA decode (ours)", t_dense, f"copy-speed floor {dense_bytes / copy / 1e6:.3f} ms"),
        ("DSA path, one layer", full, f"{t_dense / full:.2f}x faster than dense"),
        (f"DSA path, IndexCache freq {args.freq} (mean of {args.freq} layers)", shared,
         f"{t_dense / shared:.2f}x faster than dense"),
    ]
    print(f"\n| step | ms | note |  ({device_info()['gpu']}, batch {b}, context {ctx}, copy {copy:.0f} GB/s)")
    print("|---|---:|---|")
    for name, ms, note in rows_out:
        print(f"| {name} | {ms:.3f} | {note} |")
    write_json(args.json, {"bench": "dsa_decode_path", "device": device_info(), "batch": b, "context": ctx,
                           "freq": args.freq, "kernels": chosen, "copy_gbs": copy,
                           "ms": {"indexer": t_index, "topk": t_topk, "sparse": t_sparse, "dense": t_dense,
                                  "dsa_layer": full, "dsa_index_cache": shared},
                           "speedup": {"dsa_layer": t_dense / full, "dsa_index_cache": t_dense / shared}})
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
