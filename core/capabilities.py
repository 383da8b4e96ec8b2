"""What a backend claims it can run; the conformance kit runs exactly the claimed cases."""

from __future__ import annotations

from dataclasses import dataclass, field

from dsa_runtime.families import FAMILIES


@dataclass(frozen=True)
class Capabilities:
    """A backend's claims. ``None`` in a set-valued field means "any value".

    Attributes:
        families: kernel families the backend implements (subset of :data:`FAMILIES`).
        devices: torch device types it runs on (``"cpu"``, ``"cuda"``, ``"npu"``...).
        kv_layouts: MLA cache layouts for sparse attention and KV quant (``"bf16"``, ``"fp8_656"``).
        weight_dtypes: MoE expert weight dtypes (``"bf16"``, ``"fp8_e4m3"``).
        scale_fmts: FP8 scale rules it can produce (``"ue8m0"``, ``"float"``).
        head_counts: sparse-attention query head counts (None = any; e.g. {64, 128} for FlashMLA).
        index_heads: indexer head counts (None = any; DeepGEMM on SM90 takes 32 or 64).
        page_sizes: page sizes of the paged caches (None = any; 64 for DeepGEMM / FlashMLA).
        topk_values: values of k for top-k and sparse attention (None = any; {2048} for sgl-kernel).
        max_decode_queries: most queries per request in paged decode (1, 2 with MTP...; None = any).
        not_claimed: family or feature -> why it is not claimed; shown in reports.
    """

    families: frozenset[str]
    devices: frozenset[str] = frozenset({"cpu"})
    kv_layouts: frozenset[str] = frozenset({"bf16", "fp8_656"})
    weight_dtypes: frozenset[str] = frozenset({"bf16", "fp8_e4m3"})
    scale_fmts: frozenset[str] = frozenset({"ue8m0", "float"})
    head_counts: frozenset[int] | None = None
    index_heads: frozenset[int] | None = None
    page_sizes: frozenset[int] | None = None
    topk_values: frozenset[int] | None = None
    max_decode_queries: int | None = None
    not_claimed: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.families) - set(FAMILIES)
        if unknown:
            raise ValueError(f"unknown kernel families {sorted(unknown)}; valid: {', '.join(FAMILIES)}")

    @staticmethod
    def _allows(values: frozenset | None, value: object) -> bool:
        return values is None or value in values

    def unclaimed_reason(self, family: str, **needs: object) -> str | None:
        """Why a case needing ``needs`` is outside the claims, or None when it is claimed.

        Recognised keys: device, kv_layout, weight_dtype, scale_fmt, heads, index_heads, page_size, k,
        decode_queries. Unknown keys are an error so that a typo never silently claims a case.
        """
        if family not in self.families:
            return self.not_claimed.get(family, f"family {family!r} not provided")
        checks = {
            "device": ("devices", "device"),
            "kv_layout": ("kv_layouts", "KV layout"),
            "weight_dtype": ("weight_dtypes", "weight dtype"),
            "scale_fmt": ("scale_fmts", "scale format"),
            "heads": ("head_counts", "head count"),
            "index_heads": ("index_heads", "indexer head count"),
            "page_size": ("page_sizes", "page size"),
            "k": ("topk_values", "top-k width"),
        }
        for key, value in needs.items():
            if key == "decode_queries":
                if self.max_decode_queries is not None and int(value) > self.max_decode_queries:  # type: ignore[call-overload]
                    return f"{value} decode queries per request > claimed {self.max_decode_queries}"
                continue
            if key not in checks:
                raise KeyError(f"unknown capability key {key!r}")
            attr, label = checks[key]
            allowed = getattr(self, attr)
            if not self._allows(allowed, value):
                return f"{label} {value!r} not claimed (claims {sorted(allowed)})"
        return None
