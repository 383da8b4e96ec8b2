"""Backend resolution: one backend per kernel *method*, chosen once at start-up.

Each method (``sparse_attn.prefill``, ``sparse_attn.decode``, ``topk.topk_transform``...) is resolved on its own,
as SGLang resolves ``--dsa-prefill-backend`` and ``--dsa-decode-backend`` separately:

* an explicit per-method choice (``KernelConfig.methods`` / ``sparse_attn_prefill`` / ``sparse_attn_decode``)
  must be able to run the method, else :class:`ConfigError` with the reason and the backends that can;
* an explicit family choice (``KernelConfig.sparse_attn = "x"``) must run every method of the family that
  ``x`` claims; a method ``x`` does not claim at all falls back along the platform's preference list (logged);
* ``auto`` follows the platform's :class:`~dsa_runtime.platform.PlatformDefaults` preference list for the
  method (else for its family), best first, then ``reference``; every choice is logged with its reason.

The result holds plain bound methods: ``resolved.sparse_attn.prefill(...)`` is the chosen backend's own method,
with no pluggy dispatch on the hot path, even when prefill and decode come from different backends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace

from dsa_runtime.backend import Backend
from dsa_runtime.errors import ConfigError, PluginError
from dsa_runtime.families import FAMILIES, FAMILY_METHODS, METHODS, MLA_LAYOUTS
from dsa_runtime.kernel_needs import NEED_KEYS, method_needs, why_not
from dsa_runtime.padding import PaddedSparseAttn, head_padding, needs_wrapper, padding_note
from dsa_runtime.platform import Detection, Platform, PlatformDefaults
from dsa_runtime.plugin_manager import DSAPluginManager, get_manager

logger = logging.getLogger(__name__)
AUTO = "auto"
# Head padding ``auto`` accepts from an earlier preference instead of a later backend that runs the heads as they
# are, by (method, KV layout): none today. Measured on an H200 (bench/fewhead_decode.py, 2026-11-27, batch 64, 32K,
# k 2048): fp8_656 decode at 32 heads, FlashMLA padded to 64 takes 0.091 ms against the triton backend's 0.073 (its
# CUDA few-head kernel, two head groups of 16; the Triton few-head kernel's 0.109 had made 2x padding pay until
# then), at 16 heads 0.091 against 0.049 and at 8 heads against 0.048. bf16 decode at 32 heads: triton 0.075,
# TileLang padded 0.084.
CHEAP_HEAD_PADDING: dict[tuple[str, str], float] = {}
# KernelConfig fields naming one method (the serve/generate flags --dsa-prefill-backend / --dsa-decode-backend).
METHOD_FIELDS = {"sparse_attn_prefill": "sparse_attn.prefill", "sparse_attn_decode": "sparse_attn.decode"}


@dataclass
class KernelConfig:
    """Which backend runs each family or method (``"auto"`` = the platform's default) and on what.

    Attributes:
        platform: platform name or ``auto`` (highest-priority platform whose hardware is present).
        device: torch device type or ``auto`` (the platform's device).
        kv_layout: ``bf16``, ``fp8_656`` or ``auto`` (the platform's default).
        indexer, topk, sparse_attn, kv_quant, moe, moe_comm: backend name per family, or ``auto``
            (``--dsa-topk-backend`` maps onto ``topk``, ``--moe-a2a-backend`` onto ``moe_comm``).
        sparse_attn_prefill, sparse_attn_decode: backend of one method (``--dsa-prefill-backend``,
            ``--dsa-decode-backend``); ``auto`` follows ``sparse_attn``.
        methods: ``"family.method" -> backend`` for any method; wins over the fields above.
    """

    platform: str = AUTO
    device: str = AUTO
    kv_layout: str = AUTO
    indexer: str = AUTO
    topk: str = AUTO
    sparse_attn: str = AUTO
    kv_quant: str = AUTO
    moe: str = AUTO
    moe_comm: str = AUTO
    sparse_attn_prefill: str = AUTO
    sparse_attn_decode: str = AUTO
    methods: dict[str, str] = field(default_factory=dict)

    def requested(self, method: str) -> tuple[str, str]:
        """``(backend or "auto", how)`` for ``method``; ``how`` is ``"method"``, ``"family"`` or ``"auto"``."""
        if method not in METHODS:
            raise ConfigError(f"unknown kernel method {method!r}; valid: {', '.join(METHODS)}")
        explicit = [self.methods.get(method, AUTO)]
        explicit += [getattr(self, f) for f, m in METHOD_FIELDS.items() if m == method]
        named = {b for b in explicit if b != AUTO}
        if len(named) > 1:
            raise ConfigError(f"{method}: two different backends requested ({', '.join(sorted(named))})")
        if named:
            return named.pop(), "method"
        family = getattr(self, method.split(".")[0])
        return (family, "family") if family != AUTO else (AUTO, "auto")


@dataclass(frozen=True)
class Choice:
    """The backend chosen for one method, and why (``"chosen explicitly"``, ``"<platform> default"``...)."""

    family: str
    backend: str
    reason: str
    method: str = ""


class FamilyKernels:
    """One family's methods, each the bound method of the backend chosen for it.

    ``view.prefill(...)`` calls the chosen backend's ``prefill`` directly (an instance attribute, no lookup
    indirection). ``view.backends`` maps each method name to its backend's name.
    """

    def __init__(self, family: str, methods: dict[str, Callable[..., object]], backends: dict[str, str]) -> None:
        self.family = family
        self.backends = dict(backends)
        for name, fn in methods.items():
            setattr(self, name, fn)

    def __repr__(self) -> str:
        parts = ", ".join(f"{m}={b}" for m, b in self.backends.items())
        return f"FamilyKernels({self.family}: {parts})"


@dataclass
class ResolvedKernels:
    """The start-up decision: platform, device, KV layout and one backend per method.

    Attributes:
        choices: ``"family.method" -> Choice`` for every method, in contract order.
        kernels: ``family -> FamilyKernels``; also reachable as attributes (``resolved.sparse_attn.decode``).
        needs: the model/engine values the choices were checked against (``page_size`` always).
    """

    platform: str
    device: str
    kv_layout: str
    defaults: PlatformDefaults
    choices: dict[str, Choice]
    kernels: dict[str, FamilyKernels] = field(repr=False)
    needs: dict[str, object] = field(default_factory=dict)

    def __getattr__(self, family: str) -> FamilyKernels:
        # resolved.sparse_attn.decode(...) reads naturally at call sites.
        kernels = self.__dict__.get("kernels", {})
        if family in kernels:
            return kernels[family]
        raise AttributeError(family)

    def backend_of(self, method: str) -> str:
        """Name of the backend running ``"family.method"``."""
        return self.choices[method].backend

    def log_lines(self) -> tuple[str, ...]:
        """The start-up report: platform, device and KV layout, then each method's backend with its reason."""
        head = f"platform {self.platform}, device {self.device}, KV layout {self.kv_layout}"
        return (head, *(f"kernel {method}: {c.backend} ({c.reason})" for method, c in self.choices.items()))


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


def _explicit_error(
    manager: DSAPluginManager, method: str, problem: str, device: str, kv_layout: str, needs: Mapping[str, object]
) -> ConfigError:
    valid = [b.name for b in manager.backends.values() if why_not(b, method, device, kv_layout, needs) is None]
    return ConfigError(
        f"{method}: {problem}; backends that can run {method} on {device} "
        f"with {kv_layout} KV: {', '.join(valid) or 'none'}"
    )


def _resolve_method(
    manager: DSAPluginManager, platform: Platform, defaults: PlatformDefaults, config: KernelConfig,
    method: str, device: str, kv_layout: str, needs: Mapping[str, object],
) -> Choice:
    family = method.split(".")[0]
    requested, how = config.requested(method)
    if how == "auto":
        return _auto_choice(manager, platform, defaults, method, device, kv_layout, needs, [])
    backend = manager.get_backend(requested)
    problem = why_not(backend, method, device, kv_layout, needs)
    if problem is None:
        return Choice(family, requested, "chosen explicitly" if how == "method" else f"chosen for {family}", method)
    lacks = family in backend.kernels and backend.capabilities.claim(method) is None
    if how == "family" and lacks and backend.capabilities.claimed_methods(family):
        # The family's backend implements other methods of the family: this one falls back, logged.
        return _auto_choice(manager, platform, defaults, method, device, kv_layout, needs, [problem])
    raise _explicit_error(manager, method if how == "method" else family, problem, device, kv_layout, needs)


def resolve_kernels(
    config: KernelConfig | None = None,
    manager: DSAPluginManager | None = None,
    *,
    needs: Mapping[str, object] | None = None,
) -> ResolvedKernels:
    """Resolve ``config`` into kernels; raises :class:`ConfigError` with the reason and valid choices.

    Args:
        needs: what the model and engine will ask of the kernels, checked against each backend's claims where
            a method uses the key: ``heads`` (attention heads), ``index_heads``, ``k`` (index top-k),
            ``page_size`` (default: the platform's), ``decode_queries`` (1, or 2 with MTP), ``scale_fmt``,
            ``weight_dtype``. A backend whose claims exclude them is skipped (auto) or refused (explicit),
            except sparse attention's ``heads`` and ``k``, which the caller pads to the smallest claimed value
            that fits (:mod:`dsa_runtime.padding`; the choice's reason says ``pads heads 4 -> 64``).
    """
    config = config or KernelConfig()
    manager = manager or get_manager()
    unknown = [m for m in config.methods if m not in METHODS]
    if unknown:
        raise ConfigError(f"unknown kernel methods {', '.join(sorted(unknown))}; valid: {', '.join(METHODS)}")
    bad = [k for k in (needs or {}) if k not in NEED_KEYS]
    if bad:
        raise ConfigError(f"unknown kernel needs {', '.join(sorted(bad))}; valid: {', '.join(NEED_KEYS)}")
    platform, detection = _choose_platform(manager, config.platform)
    defaults = platform.defaults(detection)
    device = config.device if config.device != AUTO else (detection.device or "cpu")
    kv_layout = config.kv_layout if config.kv_layout != AUTO else defaults.kv_layout
    if kv_layout not in MLA_LAYOUTS:
        raise ConfigError(f"unknown KV layout {kv_layout!r}; valid: {', '.join(MLA_LAYOUTS)}")
    if config.kv_layout == AUTO:
        logger.info("kv_layout %s: %s", kv_layout, defaults.reasons.get("kv_layout", f"{platform.name} default"))

    checked: dict[str, object] = {"page_size": defaults.page_size, **(needs or {})}
    choices: dict[str, Choice] = {}
    for method in METHODS:
        choice = _resolve_method(manager, platform, defaults, config, method, device, kv_layout, checked)
        claim = manager.backends[choice.backend].capabilities.claim(method)
        note = padding_note(method, claim, method_needs(method, device, kv_layout, checked))
        if note:
            choice = replace(choice, reason=f"{choice.reason}; {note}")
        choices[method] = choice
        logger.info("%s -> %s (%s)", method, choice.backend, choice.reason)

    kernels: dict[str, FamilyKernels] = {}
    for family in FAMILIES:
        names = FAMILY_METHODS[family]
        bound = {m: _bind(manager.backends[choices[f"{family}.{m}"].backend], family, m) for m in names}
        for m, fn in bound.items():
            claim = manager.backends[choices[f"{family}.{m}"].backend].capabilities.claim(f"{family}.{m}")
            if needs_wrapper(f"{family}.{m}", claim):
                # The backend narrows heads or k: every call pads to a claimed shape and trims back.
                bound[m] = PaddedSparseAttn(fn, f"{family}.{m}", claim)  # type: ignore[arg-type]
        kernels[family] = FamilyKernels(family, bound, {m: choices[f"{family}.{m}"].backend for m in names})
    return ResolvedKernels(platform.name, device, kv_layout, defaults, choices, kernels, checked)


def _bind(backend: Backend, family: str, method: str) -> Callable[..., object]:
    """The backend's bound ``method`` of its ``family`` kernel object (PluginError when it lacks it)."""
    fn = getattr(backend.kernel(family), method, None)
    if not callable(fn):
        raise PluginError(
            f"backend {backend.name!r} (plugin {backend.plugin or '?'}) claims {family}.{method} but its {family} "
            f"kernel {type(backend.kernel(family)).__name__} has no method {method!r}"
        )
    return fn


def _auto_choice(
    manager: DSAPluginManager, platform: Platform, defaults: PlatformDefaults, method: str, device: str,
    kv_layout: str, needs: Mapping[str, object], skipped: list[str],
) -> Choice:
    family = method.split(".")[0]
    fallback = bool(skipped)
    # (backend, why) of the earlier preferences passed over: said in the reason
    passed_over: list[tuple[str, str]] = []
    padded: str | None = None  # the first preference that runs the method only with head/k padding
    heads = needs.get("heads")
    for name in defaults.preference(method, kv_layout, heads):
        backend = manager.backends.get(name)
        if backend is None:
            skipped.append(f"no {name!r} backend registered")
            continue
        problem = why_not(backend, method, device, kv_layout, needs)
        if problem is None:
            # A later preference that runs the shape as it is beats one that pads it: padding 16 heads to 64
            # does 4x the work (tilelang at 16 heads: 0.29 ms vs triton's 0.075 ms, H200, batch 64 at 32K).
            # Except where padding is measured to pay (CHEAP_HEAD_PADDING): then the padded backend is taken.
            claim = backend.capabilities.claim(method)
            full = method_needs(method, device, kv_layout, needs)
            pads = padding_note(method, claim, full)
            if pads and head_padding(method, claim, full) > CHEAP_HEAD_PADDING.get((method, kv_layout), 1.0):
                padded = padded or name
                passed_over.append((name, f"{name} would pad ({pads})"))
                continue
            choice = _preferred(platform, defaults, family, name, method, fallback, skipped, passed_over)
            shaped = defaults.preference_reason(method, kv_layout, heads)
            if shaped:
                choice = replace(choice, reason=f"{choice.reason}; at {heads} heads with {kv_layout} KV: {shaped}")
            if pads:  # (the note of what is padded is added by the caller)
                limit = CHEAP_HEAD_PADDING[(method, kv_layout)]
                choice = replace(choice, reason=f"{choice.reason}; padding up to {limit:g}x the heads is measured "
                                                f"to beat the backends that run them as they are")
            return choice
        skipped.append(problem)
        passed_over.append((name, problem))
    if padded is not None:
        return _preferred(platform, defaults, family, padded, method, fallback, skipped, passed_over)
    reference = manager.backends.get("reference")
    if reference is not None and why_not(reference, method, device, kv_layout, needs) is None:
        note = platform.family_notes.get(family, "")
        detail = "; ".join(skipped) if skipped else note or "no preferred backend"
        return Choice(family, "reference", f"fallback: {detail}", method)
    raise ConfigError(
        f"{method}: no backend can run on {device} with {kv_layout} KV "
        f"({'; '.join(skipped) or 'nothing preferred'}; reference unavailable)"
    )


def _preferred(platform: Platform, defaults: PlatformDefaults, family: str, name: str, method: str, fallback: bool,
               skipped: list[str], passed_over: list[tuple[str, str]]) -> Choice:
    """The choice of preference ``name``, its reason naming the other preferences passed over."""
    why = defaults.reasons.get(family)
    reason = f"{platform.name} default" + (f": {why}" if why else "")
    if fallback:
        return Choice(family, name, f"fallback: {'; '.join(skipped)}; {reason}", method)
    others = [text for other, text in passed_over if other != name]
    if others:
        reason += f" (passed over: {'; '.join(others)})"
    return Choice(family, name, reason, method)


def config_fields() -> list[str]:
    """KernelConfig fields settable by name (``--set KEY=VALUE``); ``methods`` is set per method name."""
    return [f.name for f in fields(KernelConfig) if f.name != "methods"]
