"""Small in-process plugins used by the plugin-manager and resolution tests."""

from __future__ import annotations

from dsa_runtime.backend import Backend
from dsa_runtime.capabilities import Capabilities
from dsa_runtime.families import METHODS
from dsa_runtime.hookspecs import hookimpl


def _never(self, *args, **kwargs):  # pragma: no cover - resolution tests never call kernels
    raise AssertionError("not called")


# A kernel object with every method of every family (resolution binds each claimed method).
TopKOnly = type("TopKOnly", (), {m.split(".")[1]: _never for m in METHODS})


def backend(name, families=("topk",), devices=("cpu",), available=(True, "ok"), platform="any", layouts=("bf16",)):
    return Backend(
        name=name,
        capabilities=Capabilities(
            families=frozenset(families), devices=frozenset(devices), kv_layouts=frozenset(layouts)
        ),
        kernels=dict.fromkeys(families, TopKOnly),
        available=lambda: available,
        platform=platform,
    )


def plugin_registering(*backends):
    @hookimpl
    def dsa_register_backends(register):
        for b in backends:
            register(b)

    return make_plugin(dsa_register_backends=dsa_register_backends)


def make_plugin(**hooks):
    """A hashable plugin object (pluggy needs hashable plugins) carrying the given hook functions."""
    return type("FakePlugin", (), {name: staticmethod(fn) for name, fn in hooks.items()})()
