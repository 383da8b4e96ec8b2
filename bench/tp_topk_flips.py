"""Why the tiny preset's tp 2 logits can differ from tp 1 on long prompts: top-k flips, not a split error.

CPU, fp32, gloo. One 250-token prompt on the tiny V3.2 model (random weights built per rank), tp 1 vs
tp 2, with ``index_topk`` 32 (sparse) and 512 (every key selected). Prints, per layer, the rows whose
selected key set differs between tp 1 and tp 2, and the rows whose logits differ by more than 0.05.
Usage: ``python bench/tp_topk_flips.py``.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main() -> int:
    from dsa_runtime.cache import KVCache
    from dsa_runtime.distributed import ParallelConfig, RankInfo
    from dsa_runtime.distributed.random_weights import rank_random_state
    from dsa_runtime.distributed.runtime import DistributedRunner, RankSpec
    from dsa_runtime.model.runner import ForwardBatch, ForwardSeq, ModelRunner, kernel_needs
    from dsa_runtime.resolve import KernelConfig, resolve_kernels
    from tests.distributed import hooks
    from tests.model.helpers import preset, tokens

    torch.set_num_threads(1)
    kcfg = KernelConfig(platform="cpu", indexer="reference", topk="reference")
    for topk in (32, 512):
        cfg = dataclasses.replace(preset("tiny-v32"), index_topk=topk)
        ref = ModelRunner(cfg, rank_random_state(cfg, RankInfo(0, 1, 1, 1), "cpu", seed=0),
                          kernels=resolve_kernels(kcfg, needs=kernel_needs(cfg, 16)),
                          cache=KVCache(cfg, 64, 16, "bf16", "cpu", torch.float32), dtype=torch.float32)
        hooks.record_topk(ref)
        spec = RankSpec(config=cfg, random_seed=0, dtype="float32", num_pages=64, page_size=16, kernel_config=kcfg,
                        hooks=["tests.distributed.hooks:record_topk"])
        runner = DistributedRunner(ParallelConfig(tp=2), spec)
        try:
            seqs = [ForwardSeq(tokens(250, 5), 0, list(range(1, 17)), "all")]
            rows = (runner.forward(ForwardBatch(seqs))[0] - ref.forward(ForwardBatch(seqs))[0]).abs().amax(-1)
            bad = (rows > 0.05).nonzero().flatten().tolist()
            print(f"index_topk {topk}: max |diff| {float(rows.max()):.4f}, median {float(rows.median()):.4f}, "
                  f"{len(bad)} rows > 0.05 (first {bad[:1]})")
            for layer, (a, b) in enumerate(zip(ref.topk_log, runner.runner.topk_log, strict=True)):
                diff = [r for r in range(a.shape[0]) if set(a[r].tolist()) != set(b[r].tolist())]
                print(f"  layer {layer}: {len(diff)} rows select a different key set (first {diff[:1]})")
        finally:
            runner.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
