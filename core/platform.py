"""Platforms: hardware detection and per-hardware defaults, registered by platform plugins."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Detection:
    """Result of a platform probe. Probes must not import heavy packages or initialise devices eagerly."""

    present: bool
    reason: str
    device: str | None = None  # torch device type the platform runs on, e.g. "cuda"
    details: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PlatformDefaults:
    """What ``auto`` means on a platform (SGLang's published defaults where they exist).

    Attributes:
        kv_layout: MLA KV cache layout (``"bf16"`` or ``"fp8_656"``).
        page_size: KV page size.
        dense_prefill_threshold: prompts with at most this many KV tokens use dense MHA prefill.
        prefill_attn / decode_attn: sparse-attention backend names in SGLang's vocabulary.
        backends: family -> preferred backend names, best first; the first one registered, available and
            claiming the method wins, else the ``reference`` backend.
        methods: ``"family.method"`` -> preferred backend names for that method alone (e.g. Hopper:
            ``sparse_attn.prefill`` prefers ``flashmla_sparse``, ``sparse_attn.decode`` ``fa3``); overrides
            ``backends`` for that method.
        reasons: field or family -> why this default (logged at start-up).
        by_heads: ``(method, kv_layout, heads)`` -> preferred backend names for that shape alone (measured where
            the fastest backend changes with the head count, e.g. a TP rank's 64 against 128 heads); overrides
            ``methods``. Its reason is ``reasons[f"{method}@{kv_layout}/{heads}"]``.
    """

    kv_layout: str
    page_size: int
    dense_prefill_threshold: int
    prefill_attn: str
    decode_attn: str
    backends: dict[str, tuple[str, ...]] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    methods: dict[str, tuple[str, ...]] = field(default_factory=dict)
    by_heads: dict[tuple[str, str, int], tuple[str, ...]] = field(default_factory=dict)

    def preference(self, method: str, kv_layout: str | None = None, heads: object = None) -> tuple[str, ...]:
        """Preferred backends for ``"family.method"``: the list for this KV layout and head count, else the
        method's own, else its family's."""
        if (method, kv_layout, heads) in self.by_heads:
            return self.by_heads[(method, kv_layout, heads)]  # type: ignore[index]
        if method in self.methods:
            return self.methods[method]
        return self.backends.get(method.split(".")[0], ())

    def preference_reason(self, method: str, kv_layout: str | None, heads: object) -> str | None:
        """Why :meth:`preference` has a list of its own for this shape (None when it has none)."""
        if (method, kv_layout, heads) not in self.by_heads:
            return None
        return self.reasons.get(f"{method}@{kv_layout}/{heads}", "measured for this head count")


@dataclass
class Platform:
    """A hardware platform registered through ``dsa_register_platforms(register)``.

    Attributes:
        name: unique platform name (``cpu``, ``cuda_hopper``, ``cuda_blackwell``, ``rocm``, ``npu``).
        detect: cheap probe returning :class:`Detection`.
        defaults: maps the detection to :class:`PlatformDefaults`.
        priority: higher wins when several platforms are present and none is chosen.
        family_notes: family -> why this platform has no kernel of its own for it yet (shown, never hidden).
        description: one line for ``dsa-runtime plugins``.
        plugin: filled in by the plugin manager.
    """

    name: str
    detect: Callable[[], Detection]
    defaults: Callable[[Detection], PlatformDefaults]
    priority: int = 0
    family_notes: dict[str, str] = field(default_factory=dict)
    description: str = ""
    plugin: str = ""
