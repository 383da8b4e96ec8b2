"""``ServerConfig``: the server's own settings; engine settings come from ``EngineConfig``'s fields.

Flag names follow SGLang where it has them (``--host``, ``--port``, ``--api-key``, ``--served-model-name``,
``--tool-call-parser``, ``--reasoning-parser``); the engine's (``--tp``, ``--dp``, ``--kv-cache-dtype``,
``--page-size``, ``--mem-fraction-static``, ``--chunked-prefill-size``, ``--max-running-requests``,
``--dsa-*-backend``, with the ``--nsa-*`` spellings of SGLang's V3.2 documentation as aliases) are
generated from ``EngineConfig``, by the engine's one dataclass-to-flags helper.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from typing import Any

from dsa_runtime.errors import ConfigError


def _meta(help_text: str, **extra: Any) -> dict[str, Any]:
    return {"help": help_text, **extra}


_NOT_A_FLAG = ("engine",)


@dataclass
class ServerConfig:
    """HTTP-side settings of ``dsa-runtime serve``; ``engine`` holds the EngineConfig built from its flags."""

    host: str = field(default="127.0.0.1", metadata=_meta("address to bind (loopback by default)"))
    port: int = field(default=30000, metadata=_meta("TCP port (0 picks a free one)"))
    api_key: str | None = field(default=None, metadata=_meta("require 'Authorization: Bearer KEY'"))
    served_model_name: str | None = field(
        default=None, metadata=_meta("model id reported by /v1/models and accepted in requests")
    )
    tool_call_parser: str | None = field(
        default=None, metadata=_meta("deepseekv32, deepseekv31, deepseekv3 or none (default: from the model)")
    )
    reasoning_parser: str | None = field(
        default=None, metadata=_meta("deepseek-v3, deepseek-r1 or none (default: from the model)")
    )
    reasoning_field_alias: bool = field(
        default=False, metadata=_meta("also send reasoning text as 'reasoning' (vLLM's newer field name)")
    )
    max_request_bytes: int = field(default=8 * 1024 * 1024, metadata=_meta("largest request body accepted"))
    responses_store_size: int = field(
        default=1024, metadata=_meta("responses kept in memory for previous_response_id and GET /v1/responses/ID "
                                     "(least recently used dropped first; 0 stores none)")
    )
    drain_timeout: float = field(
        default=10.0, metadata=_meta("seconds SIGINT/SIGTERM lets running requests finish before aborting")
    )
    engine_process: bool | None = field(
        default=None,
        metadata=_meta("run the engine in its own process, so HTTP work never holds up its steps (default: on "
                       "for a single CUDA device, where the engine steps faster than one process can stream)"),
    )
    engine: Any = field(default=None)  # the EngineConfig (not a flag: its fields are the engine flags)

    def uses_engine_process(self) -> bool:
        """``--engine-process`` as given, else on for a CUDA device without TP/DP (whose workers the engine
        process would have to start itself; those keep the engine on the server's thread)."""
        if self.engine_process is not None:
            return self.engine_process
        engine = self.engine
        if engine is None or engine.tp * engine.dp != 1:
            return False
        device = str(engine.device)
        if device == "auto":
            import torch

            return torch.cuda.is_available()
        return device.startswith("cuda")

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port {self.port}: must be in 0..65535")
        if self.max_request_bytes < 1024:
            raise ConfigError(f"--max-request-bytes {self.max_request_bytes}: must be at least 1024")
        if self.responses_store_size < 0:
            raise ConfigError(f"--responses-store-size {self.responses_store_size}: must be >= 0")
        if self.drain_timeout < 0:
            raise ConfigError(f"--drain-timeout {self.drain_timeout}: must be >= 0")


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """Every server flag and every engine flag, from the two config dataclasses (the engine's flag helper)."""
    from dsa_runtime.engine.cli_args import add_dataclass_arguments
    from dsa_runtime.engine.config import EngineConfig

    add_dataclass_arguments(parser.add_argument_group("server"), ServerConfig, exclude=_NOT_A_FLAG)
    add_dataclass_arguments(parser.add_argument_group("engine"), EngineConfig)


def server_config_from_args(args: argparse.Namespace) -> ServerConfig:
    """ServerConfig (with its EngineConfig) from parsed flags; ConfigError for a bad value."""
    from dsa_runtime.engine.cli_args import config_from_args
    from dsa_runtime.engine.config import EngineConfig

    engine = config_from_args(args, EngineConfig)
    values = {f: getattr(args, f) for f in ServerConfig.__dataclass_fields__ if f != "engine" and hasattr(args, f)}
    return ServerConfig(engine=engine, **values)


@dataclass(frozen=True)
class ModelFlavor:
    """How a model family's prompts are written and its outputs parsed."""

    family: str  # "v3.2", "v3.2-exp", "v3.1", "r1", "v3"
    encoder: str  # "deepseekv32" or a built-in Jinja template name (used when the checkpoint has none)
    tool_parser: str | None
    reasoning_parser: str | None


FLAVORS = {
    "v3.2": ModelFlavor("v3.2", "deepseekv32", "deepseekv32", "deepseek-v3"),
    "v3.2-exp": ModelFlavor("v3.2-exp", "deepseek_v31", "deepseekv31", "deepseek-v3"),
    "v3.1": ModelFlavor("v3.1", "deepseek_v31", "deepseekv31", "deepseek-v3"),
    "r1": ModelFlavor("r1", "deepseek_v3", "deepseekv3", "deepseek-r1"),
    "v3": ModelFlavor("v3", "deepseek_v3", "deepseekv3", None),
}


def detect_flavor(model_config: Any, name: str | None) -> ModelFlavor:
    """The model family from the config (a ``ModelConfig`` with DSA keys means V3.2; None when unknown) and the
    checkpoint/served name.

    V3.2-Exp is a DSA model that speaks the V3.1 format; R1 and V3.1 share V3's architecture, so only the name
    tells them apart (``DeepSeek-R1-0528``, ``DeepSeek-V3.1-Terminus``).
    """
    lowered = (name or "").lower()
    if model_config is not None and model_config.is_dsa:
        return FLAVORS["v3.2-exp" if re.search(r"v3\.?2[-_.]?exp", lowered) else "v3.2"]
    if re.search(r"(^|[^a-z0-9])r1([^0-9]|$)", lowered):
        return FLAVORS["r1"]
    if re.search(r"v3[._-]?1", lowered):
        return FLAVORS["v3.1"]
    return FLAVORS["v3"]
