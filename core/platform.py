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
    """

    kv_layout: str
    page_size: int
    dense_prefill_threshold: int
    prefill_attn: str
    decode_attn: str
    backends: dict[str, tuple[str, ...]] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    methods: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def preference(self, method: str) -> tuple[str, ...]:
        """Preferred backends for ``"family.method"``: its own list, else its family's."""
        if method in self.methods:
            return self.methods[method]
        return self.backends.get(method.split(".")[0], ())


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
