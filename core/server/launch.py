"""Build the server state around an engine, and run it with uvicorn until SIGINT/SIGTERM.

On a signal the server drains: new requests get a 503 error object (``/health`` too) while running requests
get up to ``ServerConfig.drain_timeout`` seconds to finish; the rest are aborted. Then the listener closes,
the engine thread stops and ``serve`` returns normally, so ``dsa-runtime serve`` exits 0.
"""

from __future__ import annotations

import logging
import re
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from dsa_runtime.engine.async_engine_process import async_engine_for
from dsa_runtime.server.config import ServerConfig, detect_flavor
from dsa_runtime.server.metrics import ServerMetrics
from dsa_runtime.server.prompting import PromptBuilder
from dsa_runtime.server.response_store import ResponseStore
from dsa_runtime.server.state import ServerState

logger = logging.getLogger("dsa_runtime.server")

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def build_state(config: ServerConfig, engine: Any, *, model_dir: str | None = None) -> ServerState:
    """Server state around an engine with the interface of docs/server.md, "The engine interface" (started here)."""
    async_engine = async_engine_for(engine)  # an engine process is read on the event loop, others stepped on a thread
    core = async_engine.engine
    model_dir = model_dir or core.model_path
    model_dir = model_dir or (config.engine.model if config.engine is not None else None)
    # The embedded model's cache folder ends in a content hash; the served name leaves it out.
    default_name = re.sub(r"-[0-9a-f]{12}$", "", Path(model_dir).name) if model_dir else "dsa-runtime-default"
    name = config.served_model_name or default_name
    flavor = detect_flavor(core.model_config, f"{model_dir or ''} {name}")
    tool = config.tool_call_parser if config.tool_call_parser is not None else flavor.tool_parser
    reasoning = config.reasoning_parser if config.reasoning_parser is not None else flavor.reasoning_parser
    tool = None if tool in ("", "none") else tool
    reasoning = None if reasoning in ("", "none") else reasoning
    _check_parsers(tool, reasoning)
    tokenizer = core.tokenizer
    async_engine.start()
    return ServerState(
        config=config,
        engine=async_engine,
        model_name=name,
        tokenizer=tokenizer,
        max_model_len=int(core.max_model_len),
        flavor=flavor,
        tool_parser=tool,
        reasoning_parser=reasoning,
        prompts=PromptBuilder(flavor, tokenizer, model_dir),
        metrics=ServerMetrics(name, async_engine.stats),
        responses=ResponseStore(config.responses_store_size),
    )


def _check_parsers(tool: str | None, reasoning: str | None) -> None:
    """Unknown parser names fail at start-up (ConfigError listing the valid ones), not on the first request."""
    from dsa_runtime.parsers.plugin import resolve_spec

    if tool is not None:
        resolve_spec("tool", tool)
    if reasoning is not None:
        resolve_spec("reasoning", reasoning)


def make_uvicorn_server(
    app: Any, host: str, port: int, drain_timeout: float, log_level: str = "warning", engine: Any = None,
    on_started: Callable[[], None] | None = None,
) -> Any:
    """A uvicorn server whose SIGINT/SIGTERM drains ``engine`` for ``drain_timeout`` s, then stops.

    While it drains, the listener stays open and the app's ``ServerState.draining`` (``app.state.server``, set
    by ``build_app``) makes every new request a 503 error object (:class:`~dsa_runtime.server.http.DrainGate`):
    clients and load balancers get an answer, not a refused connection. Once the running requests are done
    (or aborted at the deadline; the abort reaches each open stream as an SSE error event and ``[DONE]``),
    uvicorn's own shutdown closes the listener and waits for the last responses to go out, its graceful
    timeout a backstop a few seconds later. Without ``engine`` a signal just stops the server. ``on_started``
    runs once the listener is up and the signal handlers are in place (a SIGTERM from then on drains).
    """
    import asyncio

    import uvicorn

    state = getattr(getattr(app, "state", None), "server", None)

    class _Server(uvicorn.Server):
        _loop: asyncio.AbstractEventLoop | None = None
        _drain: asyncio.Task | None = None
        _draining = False

        async def startup(self, sockets: Any = None) -> None:
            self._loop = asyncio.get_running_loop()
            await super().startup(sockets=sockets)
            if on_started is not None and self.started:
                on_started()

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # uvicorn re-raises captured signals after shutdown, which would turn a clean drain into exit
            # status 130/143; record nothing. A second Ctrl-C forces the exit; a second SIGTERM changes nothing.
            if self.should_exit or self._draining:
                if sig == signal.SIGINT:
                    self.should_exit = self.force_exit = True
                return
            if engine is None or self._loop is None:  # nothing to drain (or not started yet): just stop
                self.should_exit = True
                return
            self._draining = True
            if state is not None:
                state.draining = True
            self._loop.call_soon_threadsafe(self._start_drain)

        def _start_drain(self) -> None:
            if self._drain is None:
                self._drain = asyncio.ensure_future(self._drain_then_stop())

        async def _drain_then_stop(self) -> None:
            """Let the engine finish (or abort) the running requests, then let uvicorn close the listener."""
            try:
                await engine.shutdown(drain_timeout=drain_timeout)
            finally:
                self.should_exit = True

    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=drain_timeout + 5.0,
        lifespan="on", access_log=False,
    )
    return _Server(config)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket (port 0 = any free port), so the caller knows the port before serving."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def warn_if_exposed(config: ServerConfig) -> bool:
    """Log a warning (and return True) when binding beyond loopback without an API key."""
    if config.host in _LOOPBACK or config.api_key is not None:
        return False
    logger.warning("binding %s without --api-key: anyone who can reach this port can use the model", config.host)
    return True


def serve(config: ServerConfig, engine: Any = None) -> int:
    """Run ``dsa-runtime serve``: load the engine (unless given), log kernels and URL, serve until a signal."""
    from dsa_runtime.server.app import build_app

    warn_if_exposed(config)
    if engine is None:
        if config.uses_engine_process():
            from dsa_runtime.engine.engine_process import EngineProcess

            engine = EngineProcess(config.engine)
        else:
            from dsa_runtime.engine import Engine

            engine = Engine(config.engine)
    state = build_state(config, engine)
    _log_kernels(state.engine.engine)
    app = build_app(state)
    sock = bind_socket(config.host, config.port)
    port = sock.getsockname()[1]
    host = f"[{config.host}]" if ":" in config.host else config.host

    def started() -> None:  # printed once a SIGTERM would drain: scripts may signal as soon as they see it
        print(f"dsa-runtime: serving '{state.model_name}' at http://{host}:{port}/v1 "
              f"(tool parser {state.tool_parser}, reasoning parser {state.reasoning_parser})", flush=True)

    server = make_uvicorn_server(app, config.host, port, config.drain_timeout, engine=state.engine,
                                 on_started=started)
    server.run(sockets=[sock])
    print("dsa-runtime: server stopped", flush=True)
    return 0


def _log_kernels(engine: Any) -> None:
    """Start-up log of the backend each kernel family resolved to, with the reason."""
    for line in engine.kernel_log:
        print(f"dsa-runtime: {line}", flush=True)
