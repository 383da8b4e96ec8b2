"""Triton kernels of the ``triton`` backend on Hopper, one module per concept.

Nothing here imports triton at package import: the plugin registers ``"module:Class"`` strings and the
kernels load on first use. MoE: :mod:`.moe_route` (grouped routing), :mod:`.moe_align` (sort pairs per
expert), :mod:`.moe_quant` (FP8 activation quantization), :mod:`.moe_gemm` (grouped GEMMs),
:mod:`.moe_experts` (the family object). Other families are added beside these.
"""
