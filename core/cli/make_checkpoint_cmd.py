"""``dsa-runtime make-checkpoint OUT --preset {tiny-v32,tiny-v3} [--seed N]``: a tiny random checkpoint."""

from __future__ import annotations

import argparse

HELP = "write a small random DeepSeek checkpoint (real layout: FP8 shards + index, MTP layer, tokenizer)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from dsa_runtime.loader.presets import DEFAULT_PRESET, PRESETS

    parser.add_argument("out", metavar="OUT", help="folder to create (must not exist, or be empty)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=DEFAULT_PRESET, help="model preset")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the weights (default 0)")
    parser.add_argument("--shards", type=int, default=2, help="number of safetensors shards (default 2)")


def run(args: argparse.Namespace) -> int:
    from dsa_runtime.loader.make_checkpoint import make_checkpoint

    path = make_checkpoint(args.out, args.preset, args.seed, num_shards=args.shards)
    print(f"wrote {args.preset} (seed {args.seed}) to {path}")
    return 0
