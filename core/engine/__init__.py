"""The engine: scheduler, sampling, detokenisation, stop handling, ``Engine`` and the offline ``LLM`` API.

Names are imported lazily (``from dsa_runtime.engine import Engine`` loads torch only then).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Engine": "dsa_runtime.engine.engine",
    "EngineParts": "dsa_runtime.engine.parts",
    "EngineConfig": "dsa_runtime.engine.config",
    "SamplingParams": "dsa_runtime.engine.params",
    "RequestOutput": "dsa_runtime.engine.outputs",
    "RequestMetrics": "dsa_runtime.engine.outputs",
    "TokenLogprob": "dsa_runtime.engine.outputs",
    "EngineStats": "dsa_runtime.engine.outputs",
    "LLM": "dsa_runtime.engine.llm",
    "ChatResult": "dsa_runtime.engine.chat",
    "add_dataclass_arguments": "dsa_runtime.engine.cli_args",
    "config_from_args": "dsa_runtime.engine.cli_args",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
