"""Comparison rules of the conformance kit: one named tolerance per compared quantity.

Every numeric comparison in the kit looks its bounds up here (``docs/conformance.md`` explains each row).
Inputs are generated at unit scale (``N(0, 1)``-like values), so absolute tolerances are meaningful.

An element passes when ``|got - want| <= atol + rtol * |want|`` unless the rule says otherwise:

* ``row_atol``: an extra absolute term proportional to the row's scale (``max |want|`` over the row's finite
  entries), for quantities whose error grows with the row's magnitude (indexer logits).
* ``rel_l2``: a bound on ``||got - want||_2 / ||want||_2`` per row instead of an elementwise bound (MoE
  outputs, where FP8 activation quantization in the backend is allowed and the error is statistical).
* ``ulps``: FP8 quantizations are judged against the *unquantized* input, at the scale the quantizer returned
  (the scale itself is checked separately: exactly ``2^ceil(log2(amax/448))`` for ue8m0, within
  ``[amax/448, that power]`` for float): each dequantized element may be off by ``ulps`` e4m3 units in the
  last place of its own scaled value (round to nearest: half an ulp), plus ``rel_slack * |x|`` and
  ``scale_slack * scale`` for arithmetic before the rounding (the indexer's Hadamard rotation in bf16).

Exact rules (``exact=True``) compare bytes or integers: layouts, slots, routing ids, ``-inf``/``+inf``
markers. This module imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    """Bounds for one compared quantity; see the module docstring for the meaning of each field."""

    rtol: float = 0.0
    atol: float = 0.0
    row_atol: float = 0.0
    rel_l2: float | None = None
    ulps: float | None = None
    rel_slack: float = 0.0
    scale_slack: float = 0.0
    exact: bool = False
    note: str = ""


TOLERANCES: dict[str, Tolerance] = {
    # --- indexer -------------------------------------------------------------------------------------
    "indexer.quant_q": Tolerance(
        ulps=0.5, rel_slack=2**-8, scale_slack=2**-10,
        note="Hadamard-rotated q, dequantized with the scale recovered from w; half an e4m3 ulp (+ rotation slack)",
    ),
    "indexer.quant_k": Tolerance(
        ulps=0.5, rel_slack=2**-8, scale_slack=2**-10,
        note="Hadamard-rotated k, dequantized with the returned k_scale; half an e4m3 ulp (+ rotation slack)",
    ),
    "indexer.scale_amax": Tolerance(
        rtol=2**-8, note="the quantizer's block amax may differ this much from the kit's exact rotation"
    ),
    "indexer.logits": Tolerance(
        rtol=1e-3, row_atol=2e-3, note="fp32 logits from the same FP8 inputs; -inf pattern exact"
    ),
    # --- top-k ---------------------------------------------------------------------------------------
    "topk.indices": Tolerance(
        exact=True,
        note="selected set: valid, in window, unique, count min(k, len), same value multiset as the true top-k",
    ),
    "topk.slots": Tolerance(exact=True, note="page-table transform: exact slot ids, -1 kept"),
    # --- sparse attention ----------------------------------------------------------------------------
    "sparse_attn.out": Tolerance(
        rtol=1.6e-2, atol=1e-2, note="bf16 output vs the fp32-accumulated reference rounded to bf16"
    ),
    "sparse_attn.lse": Tolerance(
        rtol=1e-4, atol=2e-3, note="natural-log lse in fp32; +inf (empty selection) must match exactly"
    ),
    # --- KV quant ------------------------------------------------------------------------------------
    "kv_quant.fp8_row": Tolerance(
        ulps=0.5, rel_slack=2**-8,
        note="backend bytes read by the reference dequantizer vs the unquantized input, half an e4m3 ulp at the "
        "stored scale (exactly 2^ceil(log2(amax/448))) + bf16 rounding of the scale and the output; k_pe exact (bf16)",
    ),
    "kv_quant.dequant": Tolerance(
        rtol=2**-8, atol=0.0, note="backend dequantizer on reference bytes vs reference dequantizer (bf16 out)"
    ),
    "kv_quant.bf16_row": Tolerance(exact=True, note="bf16 layout: the row is [c | k_pe] bit for bit"),
    "kv_quant.index_k": Tolerance(exact=True, note="index_k_132 pages: key and scale bytes at their offsets"),
    "kv_quant.untouched": Tolerance(exact=True, note="slots not written (and slot -1) keep their poison bytes"),
    # --- MoE -----------------------------------------------------------------------------------------
    "moe.route_ids": Tolerance(exact=True, note="chosen experts per token, compared as a set"),
    "moe.route_weights": Tolerance(rtol=1e-5, atol=1e-6, note="fp32 weight of each chosen expert, matched by id"),
    "moe.out_bf16": Tolerance(
        rel_l2=1e-2, note="bf16 weights: per-token relative L2 error (bf16 intermediates allowed)"
    ),
    "moe.out_fp8": Tolerance(
        rel_l2=0.12,
        note="FP8 weights: per-token relative L2 error; per-128 FP8 activation quantization (as FP8 GEMMs do) "
        "alone gives ~0.047 median, ~0.09 worst on small shapes",
    ),
    # --- MoE all-to-all ------------------------------------------------------------------------------
    "moe_comm.rows": Tolerance(exact=True, note="dispatched rows: hidden bit for bit, local ids, weights, sources"),
    "moe_comm.combine": Tolerance(
        rtol=1e-5, atol=1e-6, note="fp32 sum over the receiving ranks of per-row outputs (summation order free)"
    ),
}


def tolerance(key: str) -> Tolerance:
    """The tolerance named ``key`` (``"family.quantity"``); a KeyError lists the valid keys."""
    try:
        return TOLERANCES[key]
    except KeyError:
        raise KeyError(f"no tolerance {key!r}; known: {', '.join(sorted(TOLERANCES))}") from None
