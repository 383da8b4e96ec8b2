"""Random weights built in memory, on the rank's device, one rank's slices only (benchmarks at real sizes).

Every tensor of :func:`~dsa_runtime.loader.spec.expected_tensors` (MTP layers left out) is drawn from its
own generator seeded by ``(seed, name)``, so every rank draws the same full tensor and keeps its slice
(``sharding.shard_state``): a tp 2 model is exactly the tp 1 model, split. Scales as ``loader.random_init``:
embeddings N(0, 1), linears N(0, 1/fan_in), norms 1 + N(0, 0.02). Linears are bf16, or with ``fp8`` e4m3
in 128 x 128 blocks with fp32 ``*_scale_inv`` as the released FP8 checkpoints store them (the full-size
benchmark: V3.2's routed experts only fit 8 GPUs in FP8).
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import torch

from dsa_runtime.distributed.parallel import RankInfo
from dsa_runtime.distributed.sharding import SCALE_SUFFIX, Reader, is_mtp, shard_state

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


def rank_random_state(config, info: RankInfo, device: torch.device | str, seed: int = 0, *,
                      fp8: bool = False) -> dict[str, Tensor]:
    """This rank's slices of a random model of ``config`` (HF names), built on ``device``.

    ``fp8``: linears e4m3 + ``*_scale_inv`` fp32 blocks (``config.scale_fmt``), else bf16.
    """
    from dsa_runtime.loader.spec import expected_tensors

    dev = torch.device(device)
    specs = {n: s for n, s in expected_tensors(config, fp8=fp8).items()
             if not is_mtp(n, config.num_hidden_layers)}
    quantized: dict[str, tuple[Tensor, Tensor]] = {}  # the last FP8 weight drawn: its scales are read next

    def fp8_pair(weight: str) -> tuple[Tensor, Tensor]:
        if weight not in quantized:
            from dsa_runtime.reference.fp8 import block_quant_weight

            quantized.clear()
            spec = specs[weight]
            full = _draw(weight, tuple(spec.shape), "fp32", seed, dev)
            quantized[weight] = block_quant_weight(full, getattr(config, "scale_fmt", None) or "float")
        return quantized[weight]

    def read(name: str, dim: int | None, start: int, end: int) -> Tensor:
        if name.endswith(SCALE_SUFFIX):
            full = fp8_pair(name[: -len(SCALE_SUFFIX)])[1]
        elif specs[name].kind == "fp8":
            full = fp8_pair(name)[0]
        else:
            spec = specs[name]
            full = _draw(name, tuple(spec.shape), spec.kind, seed, dev)
        return full if dim is None else full.narrow(dim, start, end - start).clone()

    reader = Reader(list(specs), lambda n: tuple(specs[n].shape), lambda n: specs[n].kind == "fp8", read)
    return shard_state(reader, info, config.num_hidden_layers)
