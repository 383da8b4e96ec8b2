"""``dsa-runtime serve``: the OpenAI-compatible HTTP server (needs the ``[server]`` extra).

Flags come from two dataclasses: ``ServerConfig`` (HTTP side) and the engine's ``EngineConfig``; names follow
SGLang (``--host``, ``--port``, ``--api-key``, ``--tool-call-parser``, ``--kv-cache-dtype``, ...).
"""

from __future__ import annotations

import argparse

HELP = "serve the model over an OpenAI-compatible HTTP API (default: the embedded model on 127.0.0.1:30000)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from dsa_runtime.server.config import add_server_arguments

    add_server_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from dsa_runtime.errors import ConfigError

    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"the server needs the [server] extra: pip install 'dsa-runtime[server]' ({exc})") from None
    from dsa_runtime.server.config import server_config_from_args
    from dsa_runtime.server.launch import serve

    return serve(server_config_from_args(args))
