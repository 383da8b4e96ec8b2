"""``dsa-runtime serve`` as a subprocess for the load benches: a free loopback port, started, healthy, stopped."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve_process(args: list[str], timeout_s: float = 600.0, quiet: bool = False) -> Iterator[str]:
    """Run ``python -m dsa_runtime.cli.main serve --port P *args`` until ``/health`` answers; yields its URL and
    stops it (SIGTERM, then SIGKILL after a minute) on exit. ``quiet`` discards the server's output."""
    port = free_port()
    out = subprocess.DEVNULL if quiet else None
    proc = subprocess.Popen([sys.executable, "-m", "dsa_runtime.cli.main", "serve", "--port", str(port), *args],
                            stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited during start-up (code {proc.returncode})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server was not healthy within {timeout_s:.0f} s")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
