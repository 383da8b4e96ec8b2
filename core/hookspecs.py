"""pluggy hook specifications of dsa-runtime.

Hooks receive a ``register`` callable instead of returning objects (as simonw/llm does): the host owns
validation, duplicate detection and aliases, and a hook's signature never has to change. Hooks run once, at
start-up; the engine then calls the resolved kernels directly (no pluggy dispatch on the hot path).

A plugin is a module (or object) with functions decorated by :data:`hookimpl`, published under the
``dsa_runtime.plugins`` entry-point group (backends, platforms) or ``dsa_runtime.parsers`` (parsers).
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

PROJECT = "dsa_runtime"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def dsa_register_platforms(register: Callable[..., None]) -> None:
    """Register hardware platforms: ``register(Platform(...))``.

    A platform's ``detect`` must be cheap: no import of torch extensions, no device initialisation beyond
    what ``torch.cuda.get_device_capability`` needs. It answers whether the hardware is present and why.
    """


@hookspec
def dsa_register_backends(register: Callable[..., None]) -> None:
    """Register kernel backends: ``register(Backend(...))``.

    Each :class:`~dsa_runtime.backend.Backend` names the families it implements (see
    :mod:`dsa_runtime.families` for the contracts) and declares :class:`~dsa_runtime.capabilities.Capabilities`.
    Kernel factories should be ``"module:Class"`` strings so registration imports nothing heavy. A backend
    name registered twice is rejected with an error naming both plugins.
    """


@hookspec
def dsa_register_parsers(register: Callable[..., None]) -> None:
    """Register chat encoders, tool-call parsers and reasoning parsers: ``register(ParserSpec(...))``."""
