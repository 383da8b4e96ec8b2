"""bench/load_clients: a level's clients and requests split over processes, and a failing process reported."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def lc(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import load_clients as mod

    return mod


@pytest.mark.parametrize(("clients", "requests", "processes"), [(1, 4, 3), (64, 256, 4), (5, 7, 2), (3, 3, 8), (7, 0, 2)])
def test_shares_cover_every_client_and_request_once(lc, clients, requests, processes):
    parts = lc.shares(clients, requests, processes)
    assert len(parts) == min(processes, clients)
    sizes = [n for n, _ in parts]
    assert sum(sizes) == clients and max(sizes) - min(sizes) <= 1
    assert sorted(i for _, mine in parts for i in mine) == list(range(requests))
    # request i goes with client i % clients: a process's requests are those of its own clients
    first = 0
    for n, mine in parts:
        assert all(first <= i % clients < first + n for i in mine)
        first += n


def test_auto_is_a_process_per_16_clients_within_half_the_cores(lc, monkeypatch):
    monkeypatch.setattr(lc.os, "cpu_count", lambda: 16)
    assert [lc.auto_processes(c) for c in (1, 16, 17, 64, 128, 512)] == [1, 1, 2, 4, 8, 8]
    monkeypatch.setattr(lc.os, "cpu_count", lambda: 2)
    assert lc.auto_processes(128) == 1


def test_a_failing_client_process_is_an_error_not_a_hang(lc):
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    load = lc.Load(f"http://127.0.0.1:{port}", "m", 4)
    with pytest.raises(RuntimeError, match="client process failed: ConnectError"):
        lc.run_clients(load, clients=2, requests=2, processes=2)


def test_client_processes_argument(lc):
    assert lc.processes_arg("auto") == "auto" and lc.processes_arg("3") == 3
    for bad in ("0", "-1", "two"):
        with pytest.raises(lc.argparse.ArgumentTypeError, match="positive integer or auto"):
            lc.processes_arg(bad)
    assert lc.level_processes(3, 64) == 3 and lc.level_processes("auto", 1) == 1
