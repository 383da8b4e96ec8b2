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


async def _post_all(url: str, bodies: list[dict]) -> list[dict]:
    """Whole (non-streamed) chat completions of ``bodies``, all in flight at once (the engine batches them)."""
    limits = httpx.Limits(max_connections=len(bodies) + 8)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        replies = await asyncio.gather(*[client.post("/v1/chat/completions", json=b) for b in bodies])
    return [r.json() for r in replies]


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


def test_named_tool_choice_on_the_random_model_always_returns_that_call(real_server):
    """Random weights write anything after the forced opening; every completion that is not cut by max_tokens
    (a random eighth of the vocabulary stops it, so within 128 tokens all but surely) is a call of the named
    function, streamed and whole alike (same seed, same tokens)."""
    import random

    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
             for n in ("get_weather", "get_datetime", "search")]
    vocab = real_server.state.tokenizer.vocab_size
    rng = random.Random(8)
    lengths = []
    for i in range(6):
        name = tools[i % 3]["function"]["name"]
        body = {"model": "tiny", "messages": [{"role": "user", "content": f"call {i}"}], "tools": tools,
                "tool_choice": {"type": "function", "function": {"name": name}}, "max_tokens": 128,
                "temperature": 1.0, "seed": 100 + i, "stop_token_ids": rng.sample(range(vocab), vocab // 8),
                "chat_template_kwargs": {"thinking": i % 2 == 0}}
        whole = real_server.client.post("/v1/chat/completions", json=body).json()
        streamed = fold(stream_chat(real_server.client, body))
        choice = whole["choices"][0]
        assert choice["finish_reason"] == streamed["finish_reason"] == "tool_calls", (i, choice)
        calls = choice["message"]["tool_calls"]
        assert calls[0]["function"]["name"] == streamed["calls"][0]["name"] == name, i
        assert [c["function"]["arguments"] for c in calls] == [c["arguments"] for c in streamed["calls"]], i
        assert choice["message"]["reasoning_content"] is None and not streamed["reasoning_content"], i
        lengths.append(whole["usage"]["completion_tokens"])
    assert max(lengths) > 1, lengths  # the model did write after the opening (the stop set is not everything)


def test_a_shared_system_prompt_is_served_from_the_prefix_cache(real_server):
    system = {"role": "system", "content": "You answer in one short sentence. " * 40}  # several KV pages
    bodies = [{"model": "tiny", "messages": [system, {"role": "user", "content": q}], "max_tokens": 4,
               "temperature": 0} for q in ("What is 2 + 2?", "Name a colour.")]
    before = real_server.client.get("/metrics").text
    first = real_server.client.post("/v1/chat/completions", json=bodies[0]).json()["usage"]
    second = real_server.client.post("/v1/chat/completions", json=bodies[1]).json()["usage"]
    page = 64  # the CPU platform's default page size
    assert first["prompt_tokens"] > 4 * page
    # The second request shares the system prompt's full pages; only its question and the tail are computed.
    assert second["prompt_tokens_details"]["cached_tokens"] >= 4 * page
    assert second["prompt_tokens_details"]["cached_tokens"] < second["prompt_tokens"]
    after = real_server.client.get("/metrics").text

    def metric(text: str, name: str) -> float:
        return float(next(line for line in text.splitlines() if line.startswith(name)).rsplit(" ", 1)[1])

    hits = metric(after, "dsa:prefix_cache_hits_total") - metric(before, "dsa:prefix_cache_hits_total")
    assert hits == second["prompt_tokens_details"]["cached_tokens"] + first["prompt_tokens_details"]["cached_tokens"]
    assert 0 < metric(after, "dsa:prefix_cache_hit_rate") <= 1


def test_response_format_json_schema_whole_and_streamed_validate(real_server):
    """``response_format: json_schema`` at temperature 1.0: the content validates against the schema, whole and
    streamed (same seed, same text); with thinking on, the reasoning stays free and the content is the JSON."""
    import json

    import pytest

    pytest.importorskip("xgrammar")
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {
        "city": {"enum": ["Paris", "Oslo", "Lima"]},
        "temp": {"type": "integer", "minimum": -40, "maximum": 50},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    }, "required": ["city", "temp", "tags"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": schema, "strict": True}}
    for i in range(4):
        body = {"model": "tiny", "messages": [{"role": "user", "content": f"Weather {i} as JSON."}],
                "response_format": fmt, "temperature": 1.0, "seed": i, "max_tokens": 300,
                "chat_template_kwargs": {"thinking": i % 2 == 1}}
        whole = real_server.client.post("/v1/chat/completions", json=body).json()
        streamed = fold(stream_chat(real_server.client, body))
        choice = whole["choices"][0]
        assert choice["finish_reason"] == streamed["finish_reason"] == "stop", choice
        assert choice["message"]["content"] == streamed["content"]
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
    r = real_server.client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "pick"}], "temperature": 1.0, "seed": 3,
        "guided_choice": ["alpha", "beta (2)"]})
    assert r.json()["choices"][0]["message"]["content"] in ("alpha", "beta (2)")


def test_fifty_forced_tool_calls_at_temperature_one_have_schema_valid_arguments(real_server):
    """A forced V3.2 call is strict: 50 named calls with assorted parameter schemas, sampled at temperature 1.0,
    all parse (our DSML parser) into ``tool_calls`` whose arguments validate; ``required`` picks one of the
    listed tools, with valid arguments too."""
    import json

    import pytest

    pytest.importorskip("xgrammar")
    jsonschema = pytest.importorskip("jsonschema")
    from dsa_runtime.testing.json_schemas import random_object_schemas

    schemas = random_object_schemas(52, seed=23)
    bodies = [{"model": "tiny", "messages": [{"role": "user", "content": f"call {i}"}],
               "tools": [{"type": "function", "function": {"name": f"tool_{i}", "parameters": schema}}],
               "tool_choice": {"type": "function", "function": {"name": f"tool_{i}"}}, "max_tokens": 400,
               "temperature": 1.0, "seed": i} for i, schema in enumerate(schemas[:50])]
    for i, reply in enumerate(asyncio.run(_post_all(real_server.url, bodies))):
        choice = reply["choices"][0]
        assert choice["finish_reason"] == "tool_calls", (i, choice)
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == f"tool_{i}"
        jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[i])
    tools = [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in zip("ab", schemas[50:], strict=True)]
    bodies = [{"model": "tiny", "messages": [{"role": "user", "content": "go"}], "tools": tools,
               "tool_choice": "required", "max_tokens": 600, "temperature": 1.0, "seed": seed} for seed in range(3)]
    for reply in asyncio.run(_post_all(real_server.url, bodies)):
        choice = reply["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        for call in choice["message"]["tool_calls"]:
            schema = schemas[50 + "ab".index(call["function"]["name"])]
            jsonschema.validate(json.loads(call["function"]["arguments"]), schema)


def test_strict_tools_under_auto_get_schema_valid_arguments(real_server):
    """``"strict": true`` on a tool under ``tool_choice: auto``: the reply stays free text until a call block
    opens, and every call of the strict tool has arguments that validate (the embedded model calls the tools it
    is given; at temperature 1.0 its unconstrained arguments often do not fit a narrow schema)."""
    import json

    import pytest

    pytest.importorskip("xgrammar")
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]},
                                               "days": {"type": "integer", "minimum": 1, "maximum": 3}},
              "required": ["city", "days"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast",
                                               "parameters": schema, "strict": True}}]
    bodies = [{"model": "tiny", "messages": [{"role": "user", "content": f"What is the weather in {city}?"}],
               "tools": tools, "max_tokens": 300, "temperature": 1.0, "seed": i,
               "chat_template_kwargs": {"thinking": i % 2 == 1}}
              for i, city in enumerate(["Paris", "Oslo", "Lima", "Rome"] * 5)]
    calls = 0
    for reply in asyncio.run(_post_all(real_server.url, bodies)):
        choice = reply["choices"][0]
        assert choice["finish_reason"] in ("stop", "tool_calls"), choice
        for call in choice["message"].get("tool_calls") or []:
            assert call["function"]["name"] == "get_weather"
            jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
            calls += 1
    assert calls >= 5, calls  # the model did call the tool
