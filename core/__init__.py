"""dsa-runtime: a plugin-based inference runtime for DeepSeek Sparse Attention models.

Import name of the ``core/`` folder. Heavy modules (torch kernels, the conformance kit, parsers, the engine)
are imported lazily so that ``import dsa_runtime`` and ``dsa-runtime plugins`` stay fast:
``dsa_runtime.LLM`` and ``dsa_runtime.SamplingParams`` load the engine on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {"LLM": "dsa_runtime.engine.llm", "SamplingParams": "dsa_runtime.engine.params"}

__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
