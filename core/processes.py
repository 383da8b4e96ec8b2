"""How the runtime starts its child processes: tensor-parallel ranks, the engine process, isolated kit workers.

``spawn`` (the default) starts each child as a fresh interpreter, which imports torch again: 2-3 s of CPU per
child before it does anything. ``DSA_WORKER_MULTIPROC_METHOD=forkserver`` (vLLM spells its switch
``VLLM_WORKER_MULTIPROC_METHOD``) forks every child from one server process that imported torch once: the first
child pays the import, later ones start in a fraction of a second (the CPU test suite starts hundreds). Neither
inherits CUDA state (the server never touches the GPU), which is why ``fork`` is not offered. A child gets the
parent's environment as it is when the child starts (a fork server's own environment is the one it started with).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable
from typing import Any

from dsa_runtime.errors import ConfigError

ENV = "DSA_WORKER_MULTIPROC_METHOD"
METHODS = ("spawn", "forkserver")


def context() -> Any:
    """The ``multiprocessing`` context children start from (``$DSA_WORKER_MULTIPROC_METHOD``, default spawn)."""
    method = os.environ.get(ENV, "spawn")
    if method not in METHODS:
        raise ConfigError(f"{ENV}={method!r}: expected one of {', '.join(METHODS)}")
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["torch"])
    return ctx


def start(target: Callable[..., Any], *args: Any, ctx: Any = None, name: str | None = None,
          daemon: bool = True) -> Any:
    """Start ``target(*args)`` in a child process of ``ctx`` (default :func:`context`) and return the process."""
    ctx = ctx or context()
    proc = ctx.Process(target=_with_environ, args=(dict(os.environ), target, *args), name=name, daemon=daemon)
    proc.start()
    return proc


def _with_environ(environ: dict[str, str], target: Callable[..., Any], *args: Any) -> Any:
    os.environ.clear()
    os.environ.update(environ)
    return target(*args)
