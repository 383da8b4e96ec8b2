"""Random weights in the exact Hugging Face checkpoint layout (for tiny test models).

Scaled so activations stay O(1) through the layers: embeddings ``N(0, 1)``; every linear ``N(0, 1/fan_in)``
(unit-RMS inputs give unit-RMS outputs); norm weights ``1 + N(0, 0.02)`` and LayerNorm bias ``N(0, 0.02)``;
``e_score_correction_bias`` ``N(0, 0.01)`` so routing is driven by the gate but the bias still matters.
FP8 linears are quantized with :func:`dsa_runtime.reference.fp8.block_quant_weight` (config's ``scale_fmt``).
Values are drawn on the CPU from one ``torch.Generator`` in the order of :func:`expected_tensors`, so the
same (config, seed) always gives bit-identical tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsa_runtime.loader.spec import TensorSpec, expected_tensors
from dsa_runtime.model.config import ModelConfig

if TYPE_CHECKING:
    from torch import Tensor

NORM_NOISE = 0.02
BIAS_STD = 0.01


def _draw(name: str, spec: TensorSpec, gen) -> Tensor:
    """fp32 values of one (unquantized) tensor."""
    import torch

    shape = spec.shape
    if name.endswith("embed_tokens.weight"):
        return torch.randn(shape, generator=gen)
    if spec.kind == "norm":
        noise = torch.randn(shape, generator=gen) * NORM_NOISE
        return noise if name.endswith(".bias") else 1.0 + noise
    if name.endswith("e_score_correction_bias"):
        return torch.randn(shape, generator=gen) * BIAS_STD
    # A [out, in] matrix: std 1/sqrt(in) keeps unit-RMS activations unit RMS.
    fan_in = shape[-1]
    return torch.randn(shape, generator=gen) * fan_in**-0.5


def random_state_dict(config: ModelConfig, seed: int = 0, *, fp8: bool = True) -> dict[str, Tensor]:
    """All tensors of :func:`expected_tensors` for ``config`` (main stack + MTP), HF names, CPU tensors.

    Args:
        config: the model dimensions.
        seed: generator seed; the same seed gives bit-identical tensors.
        fp8: quantize the linears to ``float8_e4m3fn`` + ``weight_scale_inv`` fp32 (scale rule
            ``config.scale_fmt``); False writes them as bf16 (an unquantized checkpoint).
    Returns:
        ``{name: tensor}``: fp8 weights e4m3, scales and gate bias fp32, everything else bf16.
    """
    import torch

    from dsa_runtime.reference.fp8 import block_quant_weight

    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    specs = expected_tensors(config, fp8=fp8)
    out: dict[str, Tensor] = {}
    for name, spec in specs.items():
        if name.endswith("_scale_inv"):
            continue  # produced with its weight below
        if spec.kind == "fp8":
            # Draw the full-precision matrix with the linear's scale, then quantize into 128x128 blocks.
            w8, scale = block_quant_weight(_draw(name, TensorSpec(spec.shape, "bf16"), gen), config.scale_fmt)
            out[name] = w8
            out[f"{name}_scale_inv"] = scale
        elif spec.kind == "fp32":
            out[name] = _draw(name, spec, gen).float()
        else:
            out[name] = _draw(name, spec, gen).to(torch.bfloat16)
    return {name: out[name] for name in specs}
