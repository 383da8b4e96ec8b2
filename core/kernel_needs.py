"""What the engine asks of each kernel method, and why a backend cannot run a method here.

Shared by resolution (:mod:`dsa_runtime.resolve`) and ``dsa-runtime plugins``. The keys per method mirror the
conformance kit's cases (``dsa_runtime.testing.registry.method_keys()``; a test keeps them equal).
"""

from __future__ import annotations

from collections.abc import Mapping

from dsa_runtime.backend import Backend
from dsa_runtime.families import FAMILIES, FAMILY_METHODS
from dsa_runtime.padding import padded_needs

# Methods that read or write the MLA cache in the configured KV layout. Prefill always reads bf16 rows
# (FlashMLA's sparse prefill takes a bf16 buffer; an FP8 cache is dequantized for it).
LAYOUT_METHODS = frozenset(
    {"sparse_attn.decode", "kv_quant.quantize_mla", "kv_quant.dequantize_mla", "kv_quant.store_mla"}
)
BF16_METHODS = frozenset({"sparse_attn.prefill"})
# Model- and engine-dependent capability keys each method is checked for (besides device and KV layout), as
# the kit's cases check them (tested against dsa_runtime.testing.registry.method_keys()).
SHAPE_KEYS: dict[str, tuple[str, ...]] = {
    "indexer.quantize_q": ("index_heads", "scale_fmt"),
    "indexer.quantize_k": ("scale_fmt",),
    "indexer.logits_ragged": ("index_heads",),
    "indexer.logits_paged": ("decode_queries", "index_heads", "page_size"),
    "topk.topk": ("k",),
    "topk.page_table_transform": ("k", "page_size"),
    "topk.topk_transform": ("k", "page_size"),
    "sparse_attn.prefill": ("heads", "k"),
    "sparse_attn.decode": ("decode_queries", "heads", "k", "page_size"),
    "kv_quant.quantize_mla": (),
    "kv_quant.dequantize_mla": (),
    "kv_quant.store_mla": ("page_size",),
    "kv_quant.store_index_k": ("page_size",),
    "kv_quant.gather_index_k": ("page_size",),
    "moe.route": (),
    "moe.experts": ("weight_dtype",),
    "moe_comm.dispatch": (),
    "moe_comm.combine": (),
}
NEED_KEYS = ("heads", "index_heads", "k", "page_size", "decode_queries", "scale_fmt", "weight_dtype")


def method_needs(
    method: str, device: str, kv_layout: str, needs: Mapping[str, object] | None = None
) -> dict[str, object]:
    """Capability needs the engine puts on ``method``: device, KV layout where the method touches it, and
    those of ``needs`` (heads, k, page_size...) that the method's cases check (:data:`SHAPE_KEYS`)."""
    out: dict[str, object] = {"device": device}
    if method in LAYOUT_METHODS:
        out["kv_layout"] = kv_layout
    elif method in BF16_METHODS:
        out["kv_layout"] = "bf16"
    for key in SHAPE_KEYS[method]:
        if needs and key in needs:
            out[key] = needs[key]
    return out


def why_not(
    backend: Backend, method: str, device: str, kv_layout: str, needs: Mapping[str, object] | None = None
) -> str | None:
    """Why ``backend`` cannot run ``method`` (``"family.method"``; a bare family = all its methods), or None.

    ``needs``: model/engine values (``heads=128, k=2048, page_size=64``...) checked where the method uses them.
    Sparse attention's ``heads`` and ``k`` count as claimed when they pad to a claimed value (the caller pads).
    """
    family = method.split(".")[0]
    if family not in backend.kernels:
        return f"backend {backend.name!r} does not provide {family}"
    todo = [f"{family}.{m}" for m in FAMILY_METHODS[family]] if method in FAMILIES else [method]
    for m in todo:
        # Heads and k of sparse attention are padded by the caller (dsa_runtime.padding): check the padded values.
        m_needs = padded_needs(m, backend.capabilities.claim(m), method_needs(m, device, kv_layout, needs))
        reason = backend.capabilities.unclaimed_reason(m, **m_needs)
        if reason is not None:
            return f"backend {backend.name!r}: {m}: {reason}"
    ok, detail = backend.available()
    if not ok:
        return f"backend {backend.name!r} unavailable: {detail}"
    return None
