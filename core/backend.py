"""A backend: a named set of kernel-family implementations with declared capabilities."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from dsa_runtime.capabilities import Capabilities
from dsa_runtime.errors import PluginError
from dsa_runtime.families import FAMILIES

KernelFactory = str | Callable[[], object]


def load_object(path: str) -> object:
    """Import ``"package.module:attr"`` (or ``"package.module"``) lazily."""
    module_name, _, attr = path.partition(":")
    obj: object = importlib.import_module(module_name)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


@dataclass
class Backend:
    """A backend registered by a plugin through ``dsa_register_backends(register)``.

    Attributes:
        name: unique backend name (``reference``, ``triton``, ``flashmla_sparse``...).
        capabilities: what it claims; the conformance kit runs exactly these cases.
        kernels: family -> factory. A factory is a ``"module:Class"`` string (imported on first use, so that
            registration stays cheap) or a zero-argument callable; it returns the family's kernel object.
        available: returns ``(ok, reason)``; checked before use (e.g. "no CUDA device", "flash_mla not built").
        platform: the platform plugin it belongs to (``"any"`` when it runs everywhere).
        description: one line for ``dsa-runtime plugins``.
        plugin: filled in by the plugin manager with the registering plugin's name.
    """

    name: str
    capabilities: Capabilities
    kernels: Mapping[str, KernelFactory]
    available: Callable[[], tuple[bool, str]] = field(default=lambda: (True, "always available"))
    platform: str = "any"
    description: str = ""
    plugin: str = ""
    _cache: dict[str, object] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"invalid backend name {self.name!r}")
        extra = set(self.kernels) - set(FAMILIES)
        if extra:
            raise ValueError(f"backend {self.name!r}: unknown families {sorted(extra)}")
        missing = set(self.capabilities.families) - set(self.kernels)
        if missing:
            raise ValueError(f"backend {self.name!r} claims {sorted(missing)} but registers no kernels for them")

    def kernel(self, family: str) -> object:
        """The family's kernel object (created once)."""
        if family not in self.kernels:
            raise KeyError(f"backend {self.name!r} does not provide {family!r}")
        if family not in self._cache:
            factory = self.kernels[family]
            try:
                made = load_object(factory) if isinstance(factory, str) else factory
                self._cache[family] = made() if callable(made) else made
            except Exception as exc:
                raise PluginError(
                    f"backend {self.name!r} (plugin {self.plugin or '?'}) failed to load its {family} kernel "
                    f"{factory if isinstance(factory, str) else repr(factory)}: {type(exc).__name__}: {exc}"
                ) from exc
        return self._cache[family]
