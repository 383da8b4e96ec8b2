"""Plugin discovery and registration (pluggy), run once at start-up.

Entry-point groups ``dsa_runtime.plugins`` (platforms, backends) and ``dsa_runtime.parsers`` (parsers) are
loaded with an allow-list (``DSA_PLUGINS=a,b``; set but empty = load none), a block-list
(``DSA_BLOCK_PLUGINS=a,b``) and optional hook tracing (``DSA_TRACE_PLUGINS=1``). A plugin that fails to
import or to register is reported with its reason (``dsa-runtime plugins`` shows it), never dropped silently.
Duplicate plugin, backend, platform or parser names are rejected: the first registration wins and the later
one is reported as rejected, naming both plugins.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata

import pluggy

from dsa_runtime import hookspecs
from dsa_runtime.backend import Backend
from dsa_runtime.errors import ConfigError
from dsa_runtime.parser_spec import ParserSpec
from dsa_runtime.platform import Platform

logger = logging.getLogger(__name__)

GROUPS = ("dsa_runtime.plugins", "dsa_runtime.parsers")
DIST_NAME = "dsa-runtime"
# Used only when the distribution's metadata is missing (running from a source tree without `pip install`).
BUILTIN_PLUGINS: dict[str, tuple[str, str]] = {
    "reference": ("dsa_runtime.plugins", "dsa_runtime.reference.plugin"),
    "cuda_hopper": ("dsa_runtime.plugins", "dsa_runtime.plugins.cuda_hopper"),
    "cuda_blackwell": ("dsa_runtime.plugins", "dsa_runtime.plugins.cuda_blackwell"),
    "rocm": ("dsa_runtime.plugins", "dsa_runtime.plugins.rocm"),
    "npu": ("dsa_runtime.plugins", "dsa_runtime.plugins.npu"),
    "deepseek": ("dsa_runtime.parsers", "dsa_runtime.parsers.plugin"),
}


@dataclass
class PluginReport:
    """What happened to one plugin: ``loaded``, ``blocked``, ``not-allowed``, ``failed`` or ``rejected``."""

    name: str
    group: str
    source: str
    module: str
    status: str = "loaded"
    reason: str = ""
    problems: list[str] = field(default_factory=list)  # registration-time rejections, kept per plugin


def _env_list(name: str) -> list[str] | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    return [part.strip() for part in raw.split(",") if part.strip()]


class DSAPluginManager:
    """Loads plugins and holds what they registered. Use :func:`get_manager` for the shared instance."""

    def __init__(
        self,
        *,
        allow: Iterable[str] | None = None,
        block: Iterable[str] = (),
        trace: bool = False,
    ) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.allow = None if allow is None else set(allow)
        self.block = set(block)
        self.reports: dict[str, PluginReport] = {}
        self.platforms: dict[str, Platform] = {}
        self.backends: dict[str, Backend] = {}
        self.parsers: dict[tuple[str, str], ParserSpec] = {}
        self._parser_aliases: dict[tuple[str, str], str] = {}
        self._collected: set[str] = set()
        if trace:
            self.pm.trace.root.setwriter(sys.stderr.write)
            self.pm.enable_tracing()

    @classmethod
    def from_env(cls) -> DSAPluginManager:
        return cls(
            allow=_env_list("DSA_PLUGINS"),
            block=_env_list("DSA_BLOCK_PLUGINS") or (),
            trace=os.environ.get("DSA_TRACE_PLUGINS", "") not in ("", "0", "false"),
        )

    # -- discovery ----------------------------------------------------------------------------------------
    def _entry_points(self) -> list[tuple[str, str, str, Callable[[], object]]]:
        found: list[tuple[str, str, str, Callable[[], object]]] = []
        own_seen = False
        for group in GROUPS:
            for ep in metadata.entry_points(group=group):
                dist = getattr(ep, "dist", None)
                source = f"{dist.name} {dist.version}" if dist is not None else "unknown distribution"
                own_seen |= dist is not None and dist.name == DIST_NAME
                found.append((ep.name, group, source, ep.load))
        if not own_seen:
            for name, (group, module) in BUILTIN_PLUGINS.items():
                found.append((name, group, "builtin (no package metadata)", lambda m=module: importlib.import_module(m)))
        return found

    def add_plugin(self, plugin: object, name: str, *, group: str = "dsa_runtime.plugins", source: str = "direct") -> None:
        """Register an in-process plugin object (tests, notebooks) as if it came from an entry point."""
        self._register(name, group, source, lambda: plugin)

    def load(self) -> DSAPluginManager:
        """Discover entry points, register the plugins, then collect their registrations."""
        for name, group, source, loader in self._entry_points():
            self._register(name, group, source, loader)
        self.collect()
        return self

    def _register(self, name: str, group: str, source: str, loader: Callable[[], object]) -> None:
        report = PluginReport(name=name, group=group, source=source, module="")
        if name in self.reports:
            first = self.reports[name]
            report.status, report.reason = "rejected", (
                f"duplicate plugin name {name!r}: already provided by {first.source} ({first.module or first.group})"
            )
            logger.error("plugin %s from %s rejected: %s", name, source, report.reason)
            self.reports[f"{name} ({source})"] = report
            return
        self.reports[name] = report
        if name in self.block:
            report.status, report.reason = "blocked", "blocked by DSA_BLOCK_PLUGINS / --block-plugin"
            self.pm.set_blocked(name)
            return
        if self.allow is not None and name not in self.allow:
            report.status, report.reason = "not-allowed", "not in the DSA_PLUGINS / --plugins allow-list"
            return
        try:
            plugin = loader()
            report.module = getattr(plugin, "__name__", type(plugin).__name__)
            self.pm.register(plugin, name=name)
        except Exception as exc:  # a broken third-party plugin must not take the runtime down
            report.status, report.reason = "failed", f"{type(exc).__name__}: {exc}"
            logger.warning("plugin %s (%s) failed to load: %s", name, source, report.reason)

    # -- registration -------------------------------------------------------------------------------------
    def collect(self) -> None:
        """Call each registration hook plugin by plugin, so a failure is charged to the right plugin.

        Plugins already collected are not asked again, so ``add_plugin`` + ``collect`` is incremental.
        """
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            bad = getattr(exc, "plugin", None)
            bad_name = self.pm.get_name(bad) if bad is not None else None
            self._fail(bad_name, f"unknown hook: {exc}")
        fresh = [
            name
            for name, plugin in self.pm.list_name_plugin()
            if plugin is not None and name not in self._collected and self.reports.get(name) is not None
        ]
        for hook_name, handler in (
            ("dsa_register_platforms", self._add_platform),
            ("dsa_register_backends", self._add_backend),
            ("dsa_register_parsers", self._add_parser),
        ):
            for plugin_name in fresh:
                plugin = self.pm.get_plugin(plugin_name)
                if plugin is None or self.reports[plugin_name].status != "loaded" or not hasattr(plugin, hook_name):
                    continue
                others = [p for n, p in self.pm.list_name_plugin() if n != plugin_name and p is not None]
                caller = self.pm.subset_hook_caller(hook_name, remove_plugins=others)
                try:
                    caller(register=lambda obj, _n=plugin_name, _h=handler: _h(obj, _n))
                except Exception as exc:
                    self._fail(plugin_name, f"{hook_name} raised {type(exc).__name__}: {exc}")
        self._collected.update(fresh)

    def _fail(self, plugin_name: str | None, reason: str) -> None:
        logger.warning("plugin %s: %s", plugin_name, reason)
        if plugin_name and plugin_name in self.reports:
            self.reports[plugin_name].status = "failed"
            self.reports[plugin_name].reason = reason
            if self.pm.get_plugin(plugin_name) is not None:
                self.pm.unregister(name=plugin_name)
            # Drop whatever the plugin registered before failing: half a plugin is worse than none.
            for registry in (self.platforms, self.backends, self.parsers):
                for key in [k for k, v in registry.items() if v.plugin == plugin_name]:
                    del registry[key]
            self._parser_aliases = {
                k: v for k, v in self._parser_aliases.items() if (k[0], v) in self.parsers
            }

    def _reject(self, plugin_name: str, message: str) -> None:
        logger.error("plugin %s: %s", plugin_name, message)
        self.reports[plugin_name].problems.append(message)

    def _add_platform(self, platform: object, plugin_name: str) -> None:
        if not isinstance(platform, Platform):
            raise TypeError(f"register() expects a Platform, got {type(platform).__name__}")
        if platform.name in self.platforms:
            first = self.platforms[platform.name].plugin
            return self._reject(plugin_name, f"platform {platform.name!r} rejected: already registered by plugin {first!r}")
        platform.plugin = plugin_name
        self.platforms[platform.name] = platform

    def _add_backend(self, backend: object, plugin_name: str) -> None:
        if not isinstance(backend, Backend):
            raise TypeError(f"register() expects a Backend, got {type(backend).__name__}")
        if backend.name in self.backends:
            first = self.backends[backend.name].plugin
            return self._reject(plugin_name, f"backend {backend.name!r} rejected: already registered by plugin {first!r}")
        backend.plugin = plugin_name
        self.backends[backend.name] = backend

    def _add_parser(self, spec: object, plugin_name: str) -> None:
        if not isinstance(spec, ParserSpec):
            raise TypeError(f"register() expects a ParserSpec, got {type(spec).__name__}")
        names = (spec.name, *spec.aliases)
        for n in names:
            key = (spec.kind, n)
            if key in self._parser_aliases:
                owner = self.parsers[(spec.kind, self._parser_aliases[key])].plugin
                return self._reject(
                    plugin_name, f"{spec.kind} parser {n!r} rejected: already registered by plugin {owner!r}"
                )
        stored = ParserSpec(spec.name, spec.kind, spec.factory, spec.aliases, spec.description, plugin_name)
        self.parsers[(spec.kind, spec.name)] = stored
        for n in names:
            self._parser_aliases[(spec.kind, n)] = spec.name

    # -- lookups ------------------------------------------------------------------------------------------
    def get_backend(self, name: str) -> Backend:
        try:
            return self.backends[name]
        except KeyError:
            raise ConfigError(
                f"unknown backend {name!r}; registered backends: {', '.join(sorted(self.backends)) or 'none'}"
                + self._why_missing(name)
            ) from None

    def get_platform(self, name: str) -> Platform:
        try:
            return self.platforms[name]
        except KeyError:
            raise ConfigError(
                f"unknown platform {name!r}; registered platforms: {', '.join(sorted(self.platforms)) or 'none'}"
                + self._why_missing(name)
            ) from None

    def get_parser(self, kind: str, name: str) -> ParserSpec:
        canonical = self._parser_aliases.get((kind, name))
        if canonical is None:
            valid = sorted(n for (k, n) in self._parser_aliases if k == kind)
            raise ConfigError(f"unknown {kind} parser {name!r}; valid names: {', '.join(valid) or 'none'}")
        return self.parsers[(kind, canonical)]

    def _why_missing(self, name: str) -> str:
        report = self.reports.get(name)
        if report is not None and report.status != "loaded":
            return f" (plugin {name!r} is {report.status}: {report.reason})"
        return ""


_manager: DSAPluginManager | None = None
_lock = threading.Lock()


def get_manager() -> DSAPluginManager:
    """The process-wide plugin manager, loaded on first use from the environment's settings."""
    global _manager
    with _lock:
        if _manager is None:
            _manager = DSAPluginManager.from_env().load()
        return _manager


def reset_manager() -> None:
    """Forget the shared manager (tests, or after changing DSA_* variables)."""
    global _manager
    with _lock:
        _manager = None
