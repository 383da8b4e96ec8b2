"""DeepSeek output parsing and chat encoding (``dsa_runtime.parsers``).

Public API, imported lazily so that ``import dsa_runtime.parsers`` costs nothing::

    from dsa_runtime.parsers import OutputParser
    message = OutputParser("deepseekv32", "deepseek-v3", thinking=True).parse(text)

``OutputParser``, ``ParsedOutput``, ``ToolCall``, ``Delta``, ``get_tool_parser``, ``get_reasoning_parser``
and ``encode_messages`` (the V3.2 chat encoder).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "OutputParser": "dsa_runtime.parsers.output",
    "ParsedOutput": "dsa_runtime.parsers.types",
    "ToolCall": "dsa_runtime.parsers.types",
    "Delta": "dsa_runtime.parsers.types",
    "get_tool_parser": "dsa_runtime.parsers.plugin",
    "get_reasoning_parser": "dsa_runtime.parsers.plugin",
    "encode_messages": "dsa_runtime.parsers.encoding_v32",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
