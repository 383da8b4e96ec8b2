"""``DSA_LOG_COMPILES=1``: one stderr line for every Triton kernel variant compiled while the engine serves.

A kernel that meets a new specialisation mid-serving (a new constexpr, an integer argument that became 1 or
a multiple of 16) stalls every request for the seconds its compile takes. With the variable set, the engine
installs Triton's ``jit_cache_hook`` once it is built (graph capture done), so each line names a compile a
user would have waited for: ``dsa-runtime: Triton compile +12.3 s: kernel_name[specialisation]``. The hook
only observes (it never skips a compile) and is not installed without Triton or without the variable.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

ENV = "DSA_LOG_COMPILES"


def install_compile_log() -> bool:
    """Install the hook when ``DSA_LOG_COMPILES`` is set to a non-empty value other than ``0``; True if it was."""
    if os.environ.get(ENV, "") in ("", "0"):
        return False
    try:
        from triton import knobs
    except ImportError:
        return False
    start = time.monotonic()

    def hook(*_args: Any, **kwargs: Any) -> bool:
        what = str(kwargs.get("repr") or getattr(kwargs.get("fn"), "name", "?"))
        print(f"dsa-runtime: Triton compile +{time.monotonic() - start:.1f} s: {what[:400]}", file=sys.stderr,
              flush=True)
        return False

    knobs.runtime.jit_cache_hook = hook
    return True
