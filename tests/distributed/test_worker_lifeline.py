"""A worker exits when the process that started it dies, under either start method (a fork server is the
worker's parent process, so the parent pid cannot tell), and a bad start method is a clear error."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsa_runtime.errors import ConfigError
from dsa_runtime.processes import ENV, context

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return not (status.exists() and status.read_text().rsplit(")", 1)[1].split()[0] == "Z")  # a zombie is gone


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_worker_exits_when_its_starter_is_killed(method):
    env = {**os.environ, ENV: method}
    parent = subprocess.Popen([sys.executable, str(Path(__file__).with_name("lifeline_parent.py"))], cwd=ROOT,
                              env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        worker = int(parent.stdout.readline())
        assert _alive(worker)
        time.sleep(0.5)
        assert _alive(worker)  # the lifeline holds while its starter lives
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 20
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(worker), f"worker {worker} outlived its starter ({method})"
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever is left of the group (a failed run's worker)
            os.killpg(parent.pid, signal.SIGKILL)
        parent.wait(10)


def test_an_unknown_start_method_is_a_config_error(monkeypatch):
    monkeypatch.setenv(ENV, "fork")
    with pytest.raises(ConfigError, match="DSA_WORKER_MULTIPROC_METHOD='fork': expected one of spawn, forkserver"):
        context()
