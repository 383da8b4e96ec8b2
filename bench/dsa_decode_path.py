"""One layer of V3.2's DSA decode path at long context against dense MLA decode, with IndexCache.

    python bench/dsa_decode_path.py [--batch 64] [--context 131072] [--freq 4] [--json PATH]

Times, as CUDA-graph replays in one run on one GPU, with the kernels the engine resolves by default:

* ``indexer``: ``indexer.logits_paged`` (64 heads x 128, FP8) of one query per request over its whole context
  in the paged index-K cache (132 B / token), with its share of the copy bandwidth;
* ``topk``: ``topk.topk_transform`` (top-2048 + page-table transform) of those logits;
* ``sparse``: ``sparse_attn.decode`` (128 heads, k 2048) over an ``fp8_656`` cache;
* ``dense``: our dense path (the V3 family's): ``sparse_attn.decode`` over a bf16 cache with every cached slot of
  the request as its index set, i.e. dense bf16 MLA decode, beside the time to read that cache at copy speed;
  and FlashMLA's dense decode over the same cache when ``flash_mla`` is importable (the stronger baseline:
  speed-ups are given against it too, and against the copy floor).

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


def flashmla_dense_ms(q: torch.Tensor, cache16: torch.Tensor, b: int, ctx: int) -> float:
    """FlashMLA's dense bf16 decode (``flash_mla_with_kvcache`` without indices) over the same cache, pages of
    each request in order, as a CUDA-graph replay; NaN when FlashMLA is not importable (a peer row, not ours)."""
    try:
        import flash_mla
    except ImportError:
        return float("nan")
    import inspect

    lens = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
    pages = ctx // PAGE
    table = torch.arange(b * pages, dtype=torch.int32, device="cuda").view(b, pages)
    cache = cache16.view(-1, PAGE, 1, D_QK)
    if "cache_seqlens" in inspect.signature(flash_mla.get_mla_metadata).parameters:
        meta, splits = flash_mla.get_mla_metadata(lens, HEADS, 1)
    else:  # lazy scheduling (FlashMLA PR #150 and later): filled by the first call
        meta, splits = flash_mla.get_mla_metadata()[0], None

    def run():
        return flash_mla.flash_mla_with_kvcache(q, cache, table, lens, 512, meta, splits, softmax_scale=SM_SCALE,
                                                causal=False)

    try:
        run()
    except Exception as exc:  # reported, not fatal
        print(f"  FlashMLA dense decode failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)
        return float("nan")
    return graph_ms(run)


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
    # k = the whole context: a backend whose claim stops short of it (TileLang's 16K) is not picked
    dense_k = resolve_kernels(KernelConfig(kv_layout="bf16"), needs={"heads": HEADS, "k": ctx, "page_size": PAGE,
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
    t_flash_dense = flashmla_dense_ms(q, cache16, b, ctx)
    copy = copy_ceiling_gbs()
    dense_bytes = b * ctx * D_QK * 2
    index_bytes = b * ctx * 132
    full = t_index + t_topk + t_sparse
    shared = t_sparse + (t_index + t_topk) / args.freq
    floor = dense_bytes / copy / 1e6
    # The strongest dense baseline measured in this run: FlashMLA's dense decode when it is built, else ours.
    base, base_name = (t_flash_dense, "FlashMLA dense") if t_flash_dense == t_flash_dense else (t_dense, "our dense")
    rows_out = [
        ("indexer logits (paged)", t_index, f"{index_bytes / t_index / 1e6 / copy:.1%} of copy"),
        ("top-2048 + transform", t_topk, ""),
        (f"FP8 sparse decode, 128 heads ({chosen['sparse_attn.decode']})", t_sparse, ""),
        ("dense bf16 MLA decode (ours)", t_dense, f"copy-speed floor {floor:.3f} ms"),
        ("dense bf16 MLA decode (FlashMLA)", t_flash_dense,
         f"{floor / t_flash_dense:.1%} of copy speed" if t_flash_dense == t_flash_dense else "FlashMLA not built"),
        ("DSA path, one layer", full, f"{t_dense / full:.2f}x our dense; {base / full:.2f}x {base_name}; "
                                      f"{floor / full:.2f}x the copy floor"),
        (f"DSA path, IndexCache freq {args.freq} (mean of {args.freq} layers)", shared,
         f"{t_dense / shared:.2f}x our dense; {base / shared:.2f}x {base_name}; {floor / shared:.2f}x the copy floor"),
    ]
    print(f"\n| step | ms | note |  ({device_info()['gpu']}, batch {b}, context {ctx}, copy {copy:.0f} GB/s)")
    print("|---|---:|---|")
    for name, ms, note in rows_out:
        print(f"| {name} | {ms:.3f} | {note} |")
    write_json(args.json, {"bench": "dsa_decode_path", "device": device_info(), "batch": b, "context": ctx,
                           "freq": args.freq, "kernels": chosen, "copy_gbs": copy,
                           "ms": {"indexer": t_index, "topk": t_topk, "sparse": t_sparse, "dense": t_dense,
                                  "flashmla_dense": t_flash_dense, "dense_copy_floor": floor,
                                  "dsa_layer": full, "dsa_index_cache": shared},
                           "speedup": {"dsa_layer": t_dense / full, "dsa_index_cache": t_dense / shared},
                           "speedup_vs_strongest_dense": {"baseline": base_name, "dsa_layer": base / full,
                                                          "dsa_index_cache": base / shared}})
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
