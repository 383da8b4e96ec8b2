"""A live server on 127.0.0.1 (ephemeral port), for the server tests: in a background thread (:class:`LiveServer`)
or as ``serve()`` in a subprocess (:func:`start_serve`: real signals, and its own GIL, so a client's timings
cannot be held up by the server's work)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from dsa_runtime.server.app import build_app
from dsa_runtime.server.config import ServerConfig
from dsa_runtime.server.launch import bind_socket, build_state, make_uvicorn_server

REPO = Path(__file__).resolve().parents[2]

_SERVE = textwrap.dedent("""
    import sys
    sys.path.insert(0, {repo!r})
    from dsa_runtime.server.config import ServerConfig
    from dsa_runtime.server.launch import serve
    {engine}
    sys.exit(serve(ServerConfig(port=0, **{config!r}), engine=engine))
""")


def start_serve(engine: str, **config: Any) -> tuple[subprocess.Popen, str]:
    """Run ``serve()`` in a subprocess on 127.0.0.1, port 0; returns the process and its base URL.

    ``engine`` is one line of Python that binds ``engine`` (e.g. a ScriptedEngine); ``config`` are ServerConfig
    fields. The caller stops the process (SIGTERM, or kill in a ``finally``).
    """
    code = _SERVE.format(repo=str(REPO), engine=engine, config=config)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        match = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
        if match:
            return proc, f"http://127.0.0.1:{match.group(1)}"
        assert time.monotonic() < deadline, "server did not print its URL"
    raise AssertionError(f"server exited early with {proc.wait()}")


class LiveServer:
    """``with LiveServer(engine, **server_config) as srv:`` -- ``srv.url``, ``srv.client``, ``srv.state``."""

    def __init__(self, engine: Any, *, model_dir: str | None = None, **config: Any) -> None:
        config.setdefault("served_model_name", "test-model")
        self.config = ServerConfig(**config)
        self.state = build_state(self.config, engine, model_dir=model_dir)
        self.app = build_app(self.state)
        self._sock = bind_socket("127.0.0.1", 0)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = make_uvicorn_server(self.app, "127.0.0.1", self.port, self.config.drain_timeout)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)
        self.client: httpx.Client | None = None

    def __enter__(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("test server did not start")
            time.sleep(0.01)
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        self.client = httpx.Client(base_url=self.url, timeout=30, headers=headers)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.client is not None:
            self.client.close()
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self._sock.close()

    def metric(self, name: str) -> float:
        """The value of one ``dsa:`` sample in /metrics (summed over label sets)."""
        total, found = 0.0, False
        for line in self.client.get("/metrics").text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
                found = True
        assert found, f"metric {name} not exported"
        return total

    def wait_idle(self, timeout: float = 20.0) -> None:
        """Until the engine has no running or waiting request and no pages in use (bounded).

        The stats an engine process reports lag its commands (the last snapshot may predate an add still on
        the pipe), so idle also means the engine holds no unfinished request (an engine process: none whose
        finish has not come back, with the stats taken after it) and it held for two polls in a row.
        """
        deadline = time.monotonic() + timeout
        settled = 0
        while time.monotonic() < deadline:
            front = self.state.engine
            s = front.stats()
            idle = (s.num_running == 0 and s.num_waiting == 0 and s.pages_used == 0 and front.num_streams == 0
                    and not front.engine.has_unfinished())
            settled = settled + 1 if idle else 0
            if settled >= 2:
                return
            time.sleep(0.05)
        raise AssertionError(f"engine not idle after {timeout}s: {self.state.engine.stats()}")


def sse_events(response: httpx.Response) -> Iterator[Any]:
    """Decoded ``data:`` payloads of an SSE response; ``"[DONE]"`` as the string."""
    for line in response.iter_lines():
        if not line.startswith("data: "):
            assert line == "", f"unexpected SSE line {line!r}"
            continue
        data = line[len("data: "):]
        yield data if data == "[DONE]" else json.loads(data)


def stream_chat(client: httpx.Client, body: dict[str, Any]) -> list[Any]:
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return list(sse_events(r))


def assert_error(r: httpx.Response, status: int, param: str | None = None, code: str | None = None) -> dict:
    """``r`` is an OpenAI error object with ``status``, ``param`` and ``code``; returns its ``error`` dict."""
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert err["param"] == param and err["code"] == code, err
    assert not isinstance(err["code"], int)  # the status is on the response, never in code
    return err


def post_raw(client: httpx.Client, path: str, text: str) -> httpx.Response:
    """POST ``text`` as the JSON body byte for byte (``json=`` would re-encode it, e.g. escapes and nesting)."""
    return client.post(path, content=text.encode(), headers={"content-type": "application/json"})
