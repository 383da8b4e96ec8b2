"""Checkpoints: config parsing glue, safetensors loading and validation, the tiny-checkpoint generator,
the tokenizer wrapper and the embedded default model.

Public names are imported lazily (``from dsa_runtime.loader import load_checkpoint``) so that importing the
package does not pull in torch, safetensors or tokenizers.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TensorSpec": "dsa_runtime.loader.spec",
    "expected_tensors": "dsa_runtime.loader.spec",
    "is_mtp_tensor": "dsa_runtime.loader.spec",
    "parameter_count": "dsa_runtime.loader.spec",
    "PRESETS": "dsa_runtime.loader.presets",
    "preset_config": "dsa_runtime.loader.presets",
    "random_state_dict": "dsa_runtime.loader.random_init",
    "load_tokenizer": "dsa_runtime.loader.tokenizer",
    "Tokenizer": "dsa_runtime.loader.tokenizer",
    "make_checkpoint": "dsa_runtime.loader.make_checkpoint",
    "default_model_path": "dsa_runtime.loader.default_model",
    "embedded_model_path": "dsa_runtime.loader.default_model",
    "random_model_path": "dsa_runtime.loader.default_model",
    "load_checkpoint": "dsa_runtime.loader.checkpoint",
    "Checkpoint": "dsa_runtime.loader.checkpoint",
    "LoadError": "dsa_runtime.loader.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dsa_runtime.loader' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
