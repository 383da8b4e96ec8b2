"""Watching Triton compiles: ``DSA_LOG_COMPILES=1`` prints one stderr line for every kernel variant compiled
while the engine serves, and :func:`watch_compiles` hands each to a callback (the benches list them).

A kernel that meets a new specialisation mid-serving (a new constexpr, an integer argument that became 1 or
a multiple of 16) stalls every request for the seconds its compile takes. With the variable set, the engine
adds its printer once it is built (graph capture done), so each line names a compile a user would have waited
for: ``dsa-runtime: Triton compile +12.3 s: kernel_name[specialisation]``. One Triton ``jit_cache_hook`` serves
every watcher; it only observes (it never skips a compile) and is not installed without Triton.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

ENV = "DSA_LOG_COMPILES"

# Each watcher gets the kernel's name and Triton's description of the variant (name[options](argument types)).
_watchers: list[Callable[[str, str], None]] = []


def watch_compiles(callback: Callable[[str, str], None]) -> bool:
    """Call ``callback(name, variant)`` for every Triton compile from now on; False (nothing watched) without
    Triton."""
    try:
        from triton import knobs
    except ImportError:
        return False
    if knobs.runtime.jit_cache_hook is not _hook:
        knobs.runtime.jit_cache_hook = _hook
    _watchers.append(callback)
    return True


def _hook(*_args: Any, **kwargs: Any) -> bool:
    variant = str(kwargs.get("repr") or "?")
    name = getattr(kwargs.get("fn"), "name", None) or variant.split("[", 1)[0]
    for watcher in list(_watchers):
        watcher(name, variant)
    return False  # never skip the compile


def install_compile_log() -> bool:
    """Print every compile from now on when ``DSA_LOG_COMPILES`` is set to a non-empty value other than ``0``;
    True if the printer was added."""
    if os.environ.get(ENV, "") in ("", "0"):
        return False
    start = time.monotonic()

    def printer(_name: str, variant: str) -> None:
        print(f"dsa-runtime: Triton compile +{time.monotonic() - start:.1f} s: {variant[:400]}", file=sys.stderr,
              flush=True)

    return watch_compiles(printer)
