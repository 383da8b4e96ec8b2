"""The server on the real engine (embedded tiny model): concurrency equals sequential, cut streams free all."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.server.conftest import fold
from tests.server.needs import server_extra

server_extra()

from tests.server.live import stream_chat  # noqa: E402


def _greedy(i: int) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": f"Tell me about number {i * 7919 % 1000}"}],
            "max_tokens": 12 + i % 5, "temperature": 0, "ignore_eos": True}


async def _stream_all(url: str, bodies: list[dict]) -> list[list]:
    import json

    async def one(client, body):
        events = []
        async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    data = line[6:]
                    events.append(data if data == "[DONE]" else json.loads(data))
        return events

    limits = httpx.Limits(max_connections=len(bodies) + 8)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        return await asyncio.gather(*[one(client, b) for b in bodies])


def test_32_concurrent_streaming_greedy_requests_equal_their_sequential_results(real_server):
    bodies = [_greedy(i) for i in range(32)]
    sequential = [fold(stream_chat(real_server.client, b)) for b in bodies]
    concurrent = [fold(events) for events in asyncio.run(_stream_all(real_server.url, bodies))]
    for i, (seq, conc) in enumerate(zip(sequential, concurrent, strict=True)):
        assert seq["finish_reason"] == conc["finish_reason"] == "length", i
        assert (conc["content"], conc["reasoning_content"]) == (seq["content"], seq["reasoning_content"]), i
        assert conc["content"], i  # something was generated
    whole = real_server.client.post("/v1/chat/completions", json=bodies[3]).json()
    assert whole["choices"][0]["message"]["content"] == sequential[3]["content"]
    assert whole["usage"]["completion_tokens"] == bodies[3]["max_tokens"]


def test_200_streams_cut_mid_generation_leave_no_pages_and_no_running_requests(real_server):
    aborted_before = real_server.metric("dsa:num_aborted_requests_total")

    async def cut(client, i):
        body = {"model": "tiny", "messages": [{"role": "user", "content": f"stream {i}"}], "max_tokens": 400,
                "ignore_eos": True, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if '"content": "' in line and '"role"' not in line:
                    return True  # mid-generation: leave, closing the connection
        return False

    async def main():
        limits = httpx.Limits(max_connections=220)
        async with httpx.AsyncClient(base_url=real_server.url, timeout=120, limits=limits) as client:
            return await asyncio.gather(*[cut(client, i) for i in range(200)])

    assert all(asyncio.run(main()))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if (real_server.metric("dsa:num_requests_running"), real_server.metric("dsa:num_requests_waiting"),
                real_server.metric("dsa:kv_cache_pages_used")) == (0, 0, 0):
            break
        time.sleep(0.05)
    assert real_server.metric("dsa:num_requests_running") == 0
    assert real_server.metric("dsa:num_requests_waiting") == 0
    assert real_server.metric("dsa:kv_cache_pages_used") == 0
    assert real_server.metric("dsa:kv_cache_usage_perc") == 0
    assert real_server.metric("dsa:num_aborted_requests_total") - aborted_before == 200
    # And it still serves.
    r = real_server.client.post("/v1/chat/completions", json=_greedy(1))
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
