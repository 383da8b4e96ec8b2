"""``--json-model-override-args``: a JSON object merged into a checkpoint's ``config.json`` before the model is
built (SGLang's flag), e.g. ``{"index_topk_freq": 4}`` to turn IndexCache on for a V3.2 checkpoint.

Only overrides that leave the checkpoint's tensors as they are (names and shapes) are accepted: one that would
change them (``hidden_size``, ``num_hidden_layers``...) is a ``ConfigError`` naming the keys.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dsa_runtime.errors import ConfigError


def parse_overrides(text: str | None) -> dict[str, Any]:
    """The flag's value as a dict (``{}`` for None or empty); ``ConfigError`` for anything but a JSON object."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"--json-model-override-args is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"--json-model-override-args must be a JSON object, got {type(value).__name__}")
    return value


def override_config(config: Any, raw: dict[str, Any], overrides: dict[str, Any]) -> Any:
    """``config`` (parsed from ``raw``) with ``overrides`` merged into ``raw`` and parsed again; the checkpoint's
    expected tensors must not change."""
    if not overrides:
        return config
    from dsa_runtime.loader.spec import expected_tensors
    from dsa_runtime.model.config_parse import parse_hf_config

    new = parse_hf_config({**raw, **overrides})
    if expected_tensors(new) != expected_tensors(config):
        raise ConfigError(f"--json-model-override-args {sorted(overrides)}: changes the checkpoint's tensors "
                          "(names or shapes); only settings that keep the weights as they are can be overridden")
    return new


def override_checkpoint_config(path: str | Path, config: Any, overrides: dict[str, Any]) -> Any:
    """:func:`override_config` with ``raw`` read from ``path/config.json``."""
    if not overrides:
        return config
    raw = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    return override_config(config, raw, overrides)
