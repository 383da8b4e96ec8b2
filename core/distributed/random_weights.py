"""Random weights built in memory, on the rank's device, one rank's slices only (benchmarks at real sizes).

Every tensor of :func:`~dsa_runtime.loader.spec.expected_tensors` (bf16 linears, no FP8; MTP layers left
out) is drawn from its own generator seeded by ``(seed, name)``, so every rank draws the same full tensor
and keeps its slice (``sharding.shard_state``): a tp 2 model is exactly the tp 1 model, split. Scales as
``loader.random_init``: embeddings N(0, 1), linears N(0, 1/fan_in), norms 1 + N(0, 0.02).
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import torch

from dsa_runtime.distributed.parallel import RankInfo
from dsa_runtime.distributed.sharding import Reader, is_mtp, shard_state

if TYPE_CHECKING:
    from torch import Tensor


def _draw(name: str, shape: tuple[int, ...], kind: str, seed: int, device: torch.device) -> Tensor:
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    if name.endswith("embed_tokens.weight"):
        out = x
    elif kind == "norm":
        out = x * 0.02 if name.endswith(".bias") else 1.0 + x * 0.02
    elif name.endswith("e_score_correction_bias"):
        out = x * 0.01
    else:
        out = x * shape[-1] ** -0.5
    return out.float() if kind == "fp32" else out.to(torch.bfloat16)


def rank_random_state(config, info: RankInfo, device: torch.device | str, seed: int = 0) -> dict[str, Tensor]:
    """This rank's slices of a random bf16 model of ``config`` (HF names), built on ``device``."""
    from dsa_runtime.loader.spec import expected_tensors

    dev = torch.device(device)
    specs = {n: s for n, s in expected_tensors(config, fp8=False).items()
             if not is_mtp(n, config.num_hidden_layers)}

    def read(name: str, dim: int | None, start: int, end: int) -> Tensor:
        spec = specs[name]
        full = _draw(name, tuple(spec.shape), spec.kind, seed, dev)
        return full if dim is None else full.narrow(dim, start, end - start).clone()

    reader = Reader(list(specs), lambda n: tuple(specs[n].shape), lambda n: False, read)
    return shard_state(reader, info, config.num_hidden_layers)
