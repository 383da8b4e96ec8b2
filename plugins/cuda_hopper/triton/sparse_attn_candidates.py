"""Launch-shape defaults and GPU-sweep candidates of the Triton sparse MLA kernels, in one place.

:data:`BF16_DEFAULTS` (bf16 prefill and paged decode, by head tile) and :data:`FP8_DEFAULTS` (fp8_656 decode,
by head tile) are what ``default_config`` returns on the GPU; ``bench/sparse_attn_triton.py --sweep`` times
every entry of :data:`BF16_CANDIDATES` / :data:`FP8_CANDIDATES` and prints the best per shape, so flipping a
default after a GPU run is a one-line edit here. Labels: ``h{heads}_n{rows per step}_dv{value columns per
program}_w{warps}_s{stages}[_pipe]``; ``pipe`` is the index-prefetching kernel with 256-wide latent halves.
"""

from __future__ import annotations

from dsa_runtime.plugins.cuda_hopper.triton.mla_fp8_decode import DecodeConfig
from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_prefill import AttnConfig

A, F = AttnConfig, DecodeConfig

# Measured before this module (H100, plain kernel): prefill h64_n32_dv512_w8_s2 192.6 TFLOP/s (24.6%); bf16
# decode b64 h128 237.8 us (19.7%); fp8 decode b64 h128 0.278 ms (17.9%). Why the plain kernels stall (from their
# sm_90 TTGIR, bench/sparse_attn_compile.py): at 2 or 3 stages the loop waits for every outstanding copy
# (async_wait num=0) and loads the next indices synchronously right before issuing the next gathers, so each step
# pays the index latency plus the gather latency with no overlap (~3 us per 32-row step, ~7x the tensor work).
# The pipe kernels at s >= 3 keep s - 2 blocks of gathers in flight (async_wait num=3*(s-2)) and load indices one
# step before their gathers; "pipew" does the same with one 512-wide latent tile (two S dots and one P V dot per
# step: fewer wgmma waits). Timed on an H100 (2026-11-23 04:30 UTC, `bench/sparse_attn_triton.py --sweep`): the bf16
# defaults below won their shapes (prefill 11.1 ms vs 12.1 ms plain; decode b64 192 us vs 238 us plain).
BF16_DEFAULTS: dict[str, dict[int, AttnConfig]] = {
    "prefill": {64: A(64, 32, 512, 8, 4, "pipew"), 32: A(32, 64, 512, 4, 2), 16: A(16, 64, 512, 4, 2)},
    "decode": {64: A(64, 32, 512, 8, 4, "pipew"), 32: A(32, 64, 512, 4, 2), 16: A(16, 32, 512, 4, 3, "pipe")},
}
FP8_DEFAULTS: dict[int, DecodeConfig] = {
    # 64: n64 s3 won the H100 sweep of 2026-11-23 04:30 UTC at batch 64 / 128 (204 / 389 us; n32 s4: 272 / 522 us)
    64: F(64, 64, 8, 3, 0, "pipe"), 32: F(32, 32, 4, 2), 16: F(16, 32, 4, 3, 0, "pipe"),
}

# Swept on the GPU, keyed by the bench shape they serve. The plain kernel's former defaults come first so the
# same run shows before and after.
_BF16_H64 = [
    A(64, 32, 512, 8, 2), A(64, 32, 512, 8, 3),  # the plain kernel (the former default first)
    A(64, 32, 512, 8, 2, "pipe"),  # prefetch alone, nothing in flight during compute (ablation)
    A(64, 32, 512, 8, 3, "pipe"), A(64, 32, 512, 8, 4, "pipe"), A(64, 16, 512, 8, 4, "pipe"),
    A(64, 16, 512, 8, 5, "pipe"), A(64, 16, 512, 8, 6, "pipe"),
    A(64, 32, 256, 8, 3, "pipe"), A(64, 32, 256, 8, 4, "pipe"), A(64, 16, 256, 8, 6, "pipe"),  # half the values
    A(64, 32, 512, 8, 3, "pipew"), A(64, 32, 512, 8, 4, "pipew"), A(64, 16, 512, 8, 6, "pipew"),
]
BF16_CANDIDATES: dict[str, list[AttnConfig]] = {
    "prefill": _BF16_H64,
    "decode_h128": _BF16_H64,
    "decode_h16": [A(16, 64, 512, 4, 2), A(16, 32, 512, 4, 3), A(16, 64, 512, 4, 2, "pipe"),
                   A(16, 32, 512, 4, 3, "pipe"), A(16, 64, 256, 4, 2, "pipe"), A(16, 128, 512, 8, 2, "pipe"),
                   A(16, 32, 512, 4, 3, "pipew"), A(16, 32, 512, 4, 5, "pipew"),
                   A(64, 32, 512, 8, 4, "pipew")],  # 16 heads in a 64-row tile: wgmma (M >= 64) instead of mma.sync
    # batch 1 (split-K): fewer candidates, each at the planned and two fixed split counts
    "decode_h128_b1": [A(64, 32, 512, 8, 2), A(64, 32, 512, 8, 4, "pipe"), A(64, 32, 512, 8, 4, "pipew"),
                       A(64, 16, 512, 8, 6, "pipew"), A(64, 32, 256, 8, 4, "pipe")],
}
FP8_CANDIDATES: dict[str, list[DecodeConfig]] = {
    "decode_h128": [F(64, 32, 8, 2), F(64, 32, 8, 2, 0, "pipe"), F(64, 32, 8, 3, 0, "pipe"),
                    F(64, 32, 8, 4, 0, "pipe"), F(64, 32, 8, 5, 0, "pipe"), F(64, 16, 8, 4, 0, "pipe"),
                    F(64, 16, 8, 6, 0, "pipe"), F(64, 64, 8, 3, 0, "pipe"), F(64, 32, 8, 3)],
    "decode_h16": [F(16, 64, 4, 2), F(16, 64, 4, 2, 0, "pipe"), F(16, 32, 4, 3, 0, "pipe"),
                   F(16, 128, 4, 2, 0, "pipe")],
}
