"""Backend resolution: one concrete kernel object per family, chosen once at start-up.

``auto`` follows the detected platform's :class:`~dsa_runtime.platform.PlatformDefaults` (its preferred backend
names, best first), falling back to ``reference``; every choice is logged with its reason. An explicit choice
that cannot run (unknown name, family not provided, backend unavailable, device or KV layout not claimed) fails
with the reason and the list of backends that can. The result holds plain kernel objects: the hot path calls
their methods directly, with no pluggy dispatch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields

from dsa_runtime.backend import Backend
from dsa_runtime.errors import ConfigError
from dsa_runtime.families import FAMILIES, MLA_LAYOUTS
from dsa_runtime.platform import Detection, Platform, PlatformDefaults
from dsa_runtime.plugin_manager import DSAPluginManager, get_manager

logger = logging.getLogger(__name__)
AUTO = "auto"
LAYOUT_FAMILIES = ("sparse_attn", "kv_quant")


@dataclass
class KernelConfig:
    """Which backend runs each family (``"auto"`` = the platform's default) and on what.

    Attributes:
        platform: platform name or ``auto`` (highest-priority platform whose hardware is present).
        device: torch device type or ``auto`` (the platform's device).
        kv_layout: ``bf16``, ``fp8_656`` or ``auto`` (the platform's default).
        indexer, topk, sparse_attn, kv_quant, moe: backend name per family, or ``auto``.
    """

    platform: str = AUTO
    device: str = AUTO
    kv_layout: str = AUTO
    indexer: str = AUTO
    topk: str = AUTO
    sparse_attn: str = AUTO
    kv_quant: str = AUTO
    moe: str = AUTO


@dataclass(frozen=True)
class Choice:
    family: str
    backend: str
    reason: str


@dataclass
class ResolvedKernels:
    """The start-up decision: platform, device, KV layout and one kernel object per family."""

    platform: str
    device: str
    kv_layout: str
    defaults: PlatformDefaults
    choices: dict[str, Choice]
    kernels: dict[str, object] = field(repr=False)

    def __getattr__(self, family: str) -> object:
        # resolved.sparse_attn.decode(...) reads naturally at call sites.
        kernels = self.__dict__.get("kernels", {})
        if family in kernels:
            return kernels[family]
        raise AttributeError(family)


def why_not(backend: Backend, family: str, device: str, kv_layout: str) -> str | None:
    """Why ``backend`` cannot run ``family`` here, or None when it can."""
    if family not in backend.kernels:
        return f"backend {backend.name!r} does not provide {family}"
    caps = backend.capabilities
    needs: dict[str, object] = {"device": device}
    if family in LAYOUT_FAMILIES:
        needs["kv_layout"] = kv_layout
    reason = caps.unclaimed_reason(family, **needs)
    if reason is not None:
        return f"backend {backend.name!r}: {reason}"
    ok, detail = backend.available()
    if not ok:
        return f"backend {backend.name!r} unavailable: {detail}"
    return None


def _choose_platform(manager: DSAPluginManager, name: str) -> tuple[Platform, Detection]:
    if name != AUTO:
        platform = manager.get_platform(name)
        detection = platform.detect()
        if not detection.present:
            raise ConfigError(f"platform {name!r} was requested but its hardware is not present: {detection.reason}")
        return platform, detection
    present = []
    for platform in sorted(manager.platforms.values(), key=lambda p: -p.priority):
        detection = platform.detect()
        if detection.present:
            present.append((platform, detection))
    if not present:
        raise ConfigError("no platform detected (is the reference plugin blocked? it provides the cpu platform)")
    platform, detection = present[0]
    others = [p.name for p, _ in present[1:]]
    logger.info(
        "platform %s: %s%s", platform.name, detection.reason, f" (also present: {', '.join(others)})" if others else ""
    )
    return platform, detection


def resolve_kernels(config: KernelConfig | None = None, manager: DSAPluginManager | None = None) -> ResolvedKernels:
    """Resolve ``config`` into kernels; raises :class:`ConfigError` with the reason and valid choices."""
    config = config or KernelConfig()
    manager = manager or get_manager()
    platform, detection = _choose_platform(manager, config.platform)
    defaults = platform.defaults(detection)
    device = config.device if config.device != AUTO else (detection.device or "cpu")
    kv_layout = config.kv_layout if config.kv_layout != AUTO else defaults.kv_layout
    if kv_layout not in MLA_LAYOUTS:
        raise ConfigError(f"unknown KV layout {kv_layout!r}; valid: {', '.join(MLA_LAYOUTS)}")
    if config.kv_layout == AUTO:
        logger.info("kv_layout %s: %s", kv_layout, defaults.reasons.get("kv_layout", f"{platform.name} default"))

    choices: dict[str, Choice] = {}
    for family in FAMILIES:
        requested = getattr(config, family)
        if requested != AUTO:
            backend = manager.get_backend(requested)
            problem = why_not(backend, family, device, kv_layout)
            if problem is not None:
                valid = [b.name for b in manager.backends.values() if why_not(b, family, device, kv_layout) is None]
                raise ConfigError(
                    f"{family}: {problem}; backends that can run {family} on {device} "
                    f"with {kv_layout} KV: {', '.join(valid) or 'none'}"
                )
            choices[family] = Choice(family, requested, "chosen explicitly")
            continue
        choices[family] = _auto_choice(manager, platform, defaults, family, device, kv_layout)
        logger.info("%s -> %s (%s)", family, choices[family].backend, choices[family].reason)

    kernels = {family: manager.backends[c.backend].kernel(family) for family, c in choices.items()}
    return ResolvedKernels(platform.name, device, kv_layout, defaults, choices, kernels)


def _auto_choice(
    manager: DSAPluginManager, platform: Platform, defaults: PlatformDefaults, family: str, device: str, kv_layout: str
) -> Choice:
    skipped = []
    for name in defaults.backends.get(family, ()):
        backend = manager.backends.get(name)
        if backend is None:
            skipped.append(f"no {name!r} backend registered")
            continue
        problem = why_not(backend, family, device, kv_layout)
        if problem is None:
            why = defaults.reasons.get(family)
            return Choice(family, name, f"{platform.name} default" + (f": {why}" if why else ""))
        skipped.append(problem)
    reference = manager.backends.get("reference")
    if reference is not None and why_not(reference, family, device, kv_layout) is None:
        note = platform.family_notes.get(family, "")
        detail = "; ".join(skipped) if skipped else note or "no preferred backend"
        return Choice(family, "reference", f"fallback: {detail}")
    raise ConfigError(
        f"{family}: no backend can run on {device} with {kv_layout} KV "
        f"({'; '.join(skipped) or 'nothing preferred'}; reference unavailable)"
    )


def config_fields() -> list[str]:
    return [f.name for f in fields(KernelConfig)]
