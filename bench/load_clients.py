"""Streaming chat clients spread over processes, so that the clients are never what limits a load test.

A Python process that streams spends more CPU per chunk than the server spends sending it (SSE decoding, and
with the official ``openai`` client a pydantic model per chunk; ``bench/frontend_capacity.py`` reports both): at
64 clients and tens of thousands of tokens per second one such process is the bottleneck, not the server.
:func:`run_clients` gives each of ``processes`` spawned processes its own event loop and its share of the
clients and of the requests; the shares start together.

A request's result is a dict: ``ttft`` (start to the first content chunk), ``itl`` (the gaps between content
chunks), ``e2e`` (seconds), ``tokens`` (the usage chunk's completion tokens) and ``chunks`` (content chunks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import queue
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Load:
    """What every client streams: chat requests to ``url`` (``/v1/chat/completions``), greedy, EOS ignored."""

    url: str
    model: str
    max_tokens: int
    system: str | None = None
    client: str = "httpx"  # "httpx" (raw SSE lines) or "openai" (the official client)


def prompt(i: int) -> str:
    """The user message of request ``i`` (distinct per request, so no two share a cached prefix)."""
    return f"Request {i}: tell me a story about number {i}."


def auto_processes(clients: int) -> int:
    """A process per 16 clients, at most half the machine's cores (the server and engine need the rest)."""
    return max(1, min(-(-clients // 16), (os.cpu_count() or 2) // 2))


def processes_arg(text: str) -> int | str:
    """The ``--client-processes`` argument: a positive count or ``auto``."""
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or auto, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or auto, got {text!r}")
    return n


def level_processes(arg: int | str, clients: int) -> int:
    """The client processes of a level of ``clients`` clients for a ``--client-processes`` value."""
    return auto_processes(clients) if arg == "auto" else int(arg)


class _Timeline:
    """One streamed request's clock: its start, the gaps between content chunks, the usage's token count."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first: float | None = None
        self.last = self.start
        self.gaps: list[float] = []
        self.tokens = 0

    def content(self) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        else:
            self.gaps.append(now - self.last)
        self.last = now

    def result(self) -> dict[str, Any]:
        end = time.perf_counter()
        return {"ttft": (self.first or end) - self.start, "itl": self.gaps, "e2e": end - self.start,
                "tokens": self.tokens, "chunks": len(self.gaps) + (self.first is not None)}


def _messages(load: Load, i: int) -> list[dict[str, str]]:
    return ([{"role": "system", "content": load.system}] if load.system else []) + [
        {"role": "user", "content": prompt(i)}]


async def _one_httpx(client: Any, load: Load, i: int) -> dict[str, Any]:
    body = {"model": load.model, "messages": _messages(load, i), "max_tokens": load.max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    clock = _Timeline()
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:200]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if chunk.get("usage"):
                clock.tokens = chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                clock.content()
    return clock.result()


async def _one_openai(client: Any, load: Load, i: int) -> dict[str, Any]:
    clock = _Timeline()
    stream = await client.chat.completions.create(
        model=load.model, messages=_messages(load, i), max_tokens=load.max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    async for chunk in stream:
        if chunk.usage is not None:
            clock.tokens = chunk.usage.completion_tokens
        if chunk.choices and chunk.choices[0].delta.content:
            clock.content()
    return clock.result()


async def _stream(load: Load, clients: int, requests: Sequence[int], go: Any = None) -> tuple[list, float, float, float]:
    """``clients`` clients stream the requests numbered ``requests`` back to back; returns the results, the
    monotonic start and end, and this process's CPU seconds between them. ``go`` (a barrier shared with the other client processes), when given, is waited
    on in a thread once the clients are built."""
    import httpx

    todo = deque(requests)
    results: list[dict[str, Any]] = []
    one = _one_openai if load.client == "openai" else _one_httpx

    async def worker(requester: Any) -> None:
        while todo:
            results.append(await one(requester, load, todo.popleft()))

    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(base_url=load.url, timeout=600, limits=limits) as client:
        requester: Any = client
        if load.client == "openai":
            from openai import AsyncOpenAI

            requester = AsyncOpenAI(base_url=load.url + "/v1", api_key="unused", max_retries=0, http_client=client)
        if go is not None:
            await asyncio.to_thread(go.wait)
        start, cpu = time.monotonic(), time.process_time()
        await asyncio.gather(*[worker(requester) for _ in range(clients)])
        end, cpu = time.monotonic(), time.process_time() - cpu
    return results, start, end, cpu


def _child(load: Load, clients: int, requests: list[int], go: Any, out: Any) -> None:
    """A client process: its share of a level; sends ``("ok", results, start, end)`` or ``("error", text)``."""
    try:
        out.put(("ok", *asyncio.run(_stream(load, clients, requests, go))))
    except BaseException as exc:  # noqa: BLE001 - the parent must hear why, whatever it was
        go.abort()  # siblings still waiting to start fail at once instead of at the barrier's time-out
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def shares(clients: int, requests: int, processes: int) -> list[tuple[int, list[int]]]:
    """Clients and request numbers per process: clients split as evenly as they go, each process's requests in
    proportion to its clients (request ``i`` goes with client ``i % clients``, as one process would run them)."""
    processes = max(1, min(processes, clients))
    split = [clients // processes + (p < clients % processes) for p in range(processes)]
    out, first = [], 0
    for n in split:
        mine = range(first, first + n)
        out.append((n, [i for i in range(requests) if i % clients in mine]))
        first += n
    return out


@dataclass
class ClientRun:
    """A level's outcome: every request's result, the wall time from the common start to the last end, the
    client processes' CPU seconds meanwhile (with one process: this process's, all its threads)."""

    results: list[dict[str, Any]]
    wall_s: float
    cpu_s: float
    processes: int


def run_clients(load: Load, clients: int, requests: int, processes: int = 1) -> ClientRun:
    """``clients`` streaming clients send ``requests`` requests in all, over ``processes`` processes (one: in this
    process)."""
    parts = shares(clients, requests, processes)
    if len(parts) == 1:
        results, start, end, cpu = asyncio.run(_stream(load, clients, range(requests)))
        return ClientRun(results, end - start, cpu, 1)
    ctx = mp.get_context("spawn")
    # every child waits here after its imports and clients are built: the shares start together
    go, out = ctx.Barrier(len(parts), timeout=300), ctx.Queue()
    procs = [ctx.Process(target=_child, args=(load, n, mine, go, out), daemon=True) for n, mine in parts]
    for p in procs:
        p.start()
    try:
        got: list[tuple] = []
        while len(got) < len(procs):
            try:
                got.append(out.get(timeout=1.0))
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"a client process died (exit code {dead[0]})") from None
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    errors = [g[1] for g in got if g[0] == "error"]
    if errors:
        raise RuntimeError(f"a client process failed: {errors[0]}")
    results = [r for g in got for r in g[1]]
    if len(results) != requests:
        raise RuntimeError(f"the client processes returned {len(results)} results for {requests} requests")
    return ClientRun(results, max(g[3] for g in got) - min(g[2] for g in got), sum(g[4] for g in got), len(parts))
