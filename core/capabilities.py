"""What a backend claims it can run, per method; the conformance kit runs exactly the claimed cases.

A backend claims single methods of a family (``"sparse_attn.prefill"``, ``"indexer.logits_ragged"``...), each
with a :class:`MethodClaim`: one :class:`ValueSet` per capability key that differs between real kernels
(head counts, k, page sizes, KV layouts...). The older family-level form,
``Capabilities(families={"topk"}, head_counts={64, 128}, ...)``, still works: it claims every method of
those families with the same value sets.

Example (a FlashMLA-shaped backend)::

    Capabilities(
        devices=frozenset({"cuda"}),
        methods={
            "sparse_attn.prefill": MethodClaim(heads=ValueSet.one_of(64, 128), k=ValueSet.multiples(128, 128, 16384),
                                               kv_layouts=ValueSet.one_of("bf16")),
            "sparse_attn.decode": MethodClaim(heads=ValueSet.one_of(64, 128), k=ValueSet.multiples(64, 64, 16384),
                                              kv_layouts=ValueSet.one_of("fp8_656"), page_sizes=ValueSet.one_of(64)),
        },
        not_claimed={"indexer": "FlashMLA has no indexer"},
    )
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType

from dsa_runtime.families import FAMILIES, FAMILY_METHODS, METHODS


@dataclass(frozen=True)
class ValueSet:
    """A set of claimed values: any value, a finite set, or the multiples of ``step`` within ``[lo, hi]``.

    Build with :meth:`any`, :meth:`one_of`, :meth:`multiples` or :meth:`between` (multiples of 1).
    """

    values: frozenset[object] | None = None
    step: int | None = None
    lo: int | None = None
    hi: int | None = None

    def __post_init__(self) -> None:
        if self.step is not None:
            if self.values is not None:
                raise ValueError("a ValueSet is either a finite set or a range, not both")
            if self.step < 1 or self.lo is None or self.hi is None or self.lo > self.hi:
                raise ValueError(f"invalid range: multiples of {self.step} within [{self.lo}, {self.hi}]")

    @classmethod
    def any(cls) -> ValueSet:
        return cls()

    @classmethod
    def one_of(cls, *values: object) -> ValueSet:
        """A finite set; ``one_of()`` (empty) claims nothing."""
        return cls(values=frozenset(values))

    @classmethod
    def multiples(cls, step: int, lo: int, hi: int) -> ValueSet:
        """Integers ``v`` with ``v % step == 0`` and ``lo <= v <= hi`` (FlashMLA prefill: k % 128 == 0)."""
        return cls(step=step, lo=lo, hi=hi)

    @classmethod
    def between(cls, lo: int, hi: int) -> ValueSet:
        """Integers in ``[lo, hi]``."""
        return cls(step=1, lo=lo, hi=hi)

    @classmethod
    def of(cls, spec: ValueSet | Iterable[object] | None) -> ValueSet:
        """Coerce: ``None`` -> any, an iterable -> that finite set, a ValueSet -> itself."""
        if spec is None:
            return cls.any()
        if isinstance(spec, ValueSet):
            return spec
        if isinstance(spec, (str, bytes)):
            raise TypeError(f"a value set needs a collection of values, got the string {spec!r}")
        return cls.one_of(*spec)

    @property
    def is_any(self) -> bool:
        return self.values is None and self.step is None

    def allows(self, value: object) -> bool:
        if self.step is not None:
            if isinstance(value, bool) or not isinstance(value, int):
                return False
            assert self.lo is not None and self.hi is not None
            return self.lo <= value <= self.hi and value % self.step == 0
        return self.values is None or value in self.values

    def describe(self) -> str:
        """Readable claim: ``any``, ``one of [64, 128]``, ``multiples of 128 in [128, 16384]``, ``nothing``."""
        if self.step is not None:
            span = f"[{self.lo}, {self.hi}]"
            return f"values in {span}" if self.step == 1 else f"multiples of {self.step} in {span}"
        if self.values is None:
            return "any"
        if not self.values:
            return "nothing"
        return f"one of {sorted(self.values, key=repr) if _mixed(self.values) else sorted(self.values)}"  # type: ignore[type-var]


def _mixed(values: frozenset[object]) -> bool:
    return len({type(v) for v in values}) > 1


ANY = ValueSet.any()

# capability key (as cases pass it) -> (MethodClaim field, label used in reasons)
KEYS: dict[str, tuple[str, str]] = {
    "device": ("devices", "device"),
    "kv_layout": ("kv_layouts", "KV layout"),
    "weight_dtype": ("weight_dtypes", "weight dtype"),
    "scale_fmt": ("scale_fmts", "scale format"),
    "heads": ("heads", "head count"),
    "index_heads": ("index_heads", "indexer head count"),
    "k": ("k", "k"),
    "page_size": ("page_sizes", "page size"),
    "decode_queries": ("decode_queries", "decode queries per request"),
}


@dataclass(frozen=True)
class MethodClaim:
    """What one method is claimed for; each field a :class:`ValueSet` (default: any value).

    ``devices`` narrows the backend-wide :attr:`Capabilities.devices` for this method. Fields given as plain
    collections (``{64, 128}``) are turned into finite sets.
    """

    devices: ValueSet = ANY
    kv_layouts: ValueSet = ANY
    weight_dtypes: ValueSet = ANY
    scale_fmts: ValueSet = ANY
    heads: ValueSet = ANY
    index_heads: ValueSet = ANY
    k: ValueSet = ANY
    page_sizes: ValueSet = ANY
    decode_queries: ValueSet = ANY

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, ValueSet.of(getattr(self, f.name)))

    def unclaimed_reason(self, **needs: object) -> str | None:
        """Why ``needs`` fall outside this claim (first key that does), or None. Unknown keys raise KeyError."""
        for key, value in needs.items():
            if key not in KEYS:
                raise KeyError(f"unknown capability key {key!r}; valid: {', '.join(KEYS)}")
            attr, label = KEYS[key]
            allowed: ValueSet = getattr(self, attr)
            if not allowed.allows(value):
                return f"{label} {value!r} not claimed: claims {allowed.describe()}"
        return None

    def describe(self) -> str:
        """The non-trivial value sets, e.g. ``heads one of [64, 128]; k multiples of 128 in [128, 16384]``."""
        parts = [f"{f.name} {getattr(self, f.name).describe()}" for f in fields(self) if not getattr(self, f.name).is_any]
        return "; ".join(parts) or "any values"


def _family_of(method: str) -> str:
    return method.split(".", 1)[0]


@dataclass(frozen=True)
class Capabilities:
    """A backend's claims.

    Attributes:
        methods: ``"family.method"`` -> :class:`MethodClaim` (see :data:`dsa_runtime.families.METHODS`).
        devices: torch device types the backend runs on (``"cpu"``, ``"cuda"``, ``"npu"``...).
        not_claimed: family or ``"family.method"`` -> why it is not claimed; shown in reports.
        families: family-level form: claim *every* method of these families, with the value sets below
            (``None`` = any value). After construction, ``families`` lists every family with a claimed method.
        kv_layouts, weight_dtypes, scale_fmts, head_counts, index_heads, page_sizes, topk_values: the value
            sets of the family-level form (``topk_values`` is the ``k`` key).
        max_decode_queries: family-level form: most queries per request in paged decode (None = any).

    Explicit ``methods`` entries win over the family-level expansion.
    """

    families: frozenset[str] = frozenset()
    devices: frozenset[str] = frozenset({"cpu"})
    kv_layouts: frozenset[str] | None = frozenset({"bf16", "fp8_656"})
    weight_dtypes: frozenset[str] | None = frozenset({"bf16", "fp8_e4m3"})
    scale_fmts: frozenset[str] | None = frozenset({"ue8m0", "float"})
    head_counts: frozenset[int] | None = None
    index_heads: frozenset[int] | None = None
    page_sizes: frozenset[int] | None = None
    topk_values: frozenset[int] | None = None
    max_decode_queries: int | None = None
    methods: Mapping[str, MethodClaim] = field(default_factory=dict)
    not_claimed: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.families) - set(FAMILIES)
        if unknown:
            raise ValueError(f"unknown kernel families {sorted(unknown)}; valid: {', '.join(FAMILIES)}")
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise ValueError(f"unknown kernel methods {sorted(bad)}; valid: {', '.join(METHODS)}")
        bad = [k for k in self.not_claimed if k not in METHODS and k not in FAMILIES]
        if bad:
            raise ValueError(f"not_claimed keys {sorted(bad)} are neither families nor family.method names")
        for name, claim in self.methods.items():
            if not isinstance(claim, MethodClaim):
                raise TypeError(f"claim for {name!r} must be a MethodClaim, got {type(claim).__name__}")
        legacy = MethodClaim(
            kv_layouts=ValueSet.of(self.kv_layouts),
            weight_dtypes=ValueSet.of(self.weight_dtypes),
            scale_fmts=ValueSet.of(self.scale_fmts),
            heads=ValueSet.of(self.head_counts),
            index_heads=ValueSet.of(self.index_heads),
            k=ValueSet.of(self.topk_values),
            page_sizes=ValueSet.of(self.page_sizes),
            decode_queries=ANY if self.max_decode_queries is None else ValueSet.between(1, self.max_decode_queries),
        )
        expanded = {f"{f}.{m}": legacy for f in FAMILIES if f in self.families for m in FAMILY_METHODS[f]}
        expanded.update(self.methods)
        ordered = {m: expanded[m] for m in METHODS if m in expanded}
        object.__setattr__(self, "methods", MappingProxyType(ordered))
        object.__setattr__(self, "families", frozenset(_family_of(m) for m in ordered))
        object.__setattr__(self, "not_claimed", MappingProxyType(dict(self.not_claimed)))

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # The read-only mapping views do not pickle; the isolated kit worker receives Backend objects by pickle.
        return (_rebuild_capabilities, (self.devices, dict(self.methods), dict(self.not_claimed)))

    def claimed_methods(self, family: str | None = None) -> list[str]:
        """Claimed ``family.method`` names (of one family when given), in contract order."""
        return [m for m in self.methods if family is None or _family_of(m) == family]

    def claim(self, method: str) -> MethodClaim | None:
        return self.methods.get(method)

    def unclaimed_reason(self, method: str, **needs: object) -> str | None:
        """Why a case of ``method`` needing ``needs`` is outside the claims, or None when it is claimed.

        Args:
            method: ``"family.method"`` (e.g. ``"sparse_attn.prefill"``). A bare family name asks whether
                *every* method of the family is claimed for ``needs``.
            needs: capability keys of :data:`KEYS` (device, kv_layout, weight_dtype, scale_fmt, heads,
                index_heads, k, page_size, decode_queries). Unknown keys raise ``KeyError`` so that a typo
                never silently claims a case.
        """
        if method in FAMILIES:
            for m in FAMILY_METHODS[method]:
                if reason := self.unclaimed_reason(f"{method}.{m}", **needs):
                    return reason
            return None
        if method not in METHODS:
            raise KeyError(f"unknown kernel method {method!r}; valid: {', '.join(METHODS)}")
        for key in needs:
            if key not in KEYS:
                raise KeyError(f"unknown capability key {key!r}; valid: {', '.join(KEYS)}")
        family = _family_of(method)
        claim = self.methods.get(method)
        if claim is None:
            if method in self.not_claimed:
                return self.not_claimed[method]
            if family not in self.families:
                return self.not_claimed.get(family, f"family {family!r} not provided")
            claimed = ", ".join(self.claimed_methods(family))
            return self.not_claimed.get(family, f"method {method} not provided (claims {claimed} of {family})")
        if "device" in needs and needs["device"] not in self.devices:
            return f"device {needs['device']!r} not claimed: claims {ValueSet.of(self.devices).describe()}"
        return claim.unclaimed_reason(**needs)

    def describe(self) -> dict[str, str]:
        """``method -> readable claim`` for every claimed method (for ``dsa-runtime plugins`` and reports)."""
        return {m: c.describe() for m, c in self.methods.items()}


def _rebuild_capabilities(devices: frozenset[str], methods: dict[str, MethodClaim], not_claimed: dict[str, str]) -> Capabilities:
    """Unpickle a :class:`Capabilities` from its expanded per-method claims."""
    return Capabilities(devices=devices, methods=methods, not_claimed=not_claimed)
