"""Helpers shared by the server tests: folding a chat stream back into a message."""

from __future__ import annotations

import json
from typing import Any

import pytest


def fold(events: list[Any]) -> dict[str, Any]:
    """Rebuild choice 0's message from chat chunks, checking the OpenAI chunk shapes on the way."""
    assert events[-1] == "[DONE]", events[-1]
    message: dict[str, Any] = {"content": "", "reasoning_content": "", "calls": {}, "finish_reason": None}
    chunks = list(events[:-1])
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    usage = None
    for chunk in chunks:
        assert chunk["object"] == "chat.completion.chunk" and chunk["id"] == chunks[0]["id"]
        if not chunk["choices"]:
            usage = chunk["usage"]
            continue
        assert message["finish_reason"] is None, "nothing may follow the finish chunk but usage"
        choice = chunk["choices"][0]
        delta = choice["delta"]
        message["content"] += delta.get("content") or ""
        message["reasoning_content"] += delta.get("reasoning_content") or ""
        for tc in delta.get("tool_calls", []):
            call = message["calls"].setdefault(tc["index"], {"id": None, "name": None, "arguments": ""})
            if "id" in tc:
                assert call["id"] is None and tc["type"] == "function" and tc["function"]["arguments"] == ""
                call["id"], call["name"] = tc["id"], tc["function"]["name"]
            call["arguments"] += tc["function"].get("arguments", "")
        if choice["finish_reason"] is not None:
            assert delta == {}
            message["finish_reason"] = choice["finish_reason"]
    message["usage"] = usage
    message["calls"] = [message["calls"][i] for i in sorted(message["calls"])]
    return message


def calls_of(message: dict[str, Any]) -> list[tuple[str, Any]]:
    """``[(name, parsed arguments)]`` of a whole message or a folded stream."""
    calls = message.get("tool_calls") or message.get("calls") or []
    out = []
    for c in calls:
        fn = c.get("function", c)
        out.append((fn["name"], json.loads(fn["arguments"])))
    return out


@pytest.fixture(scope="session")
def real_server():
    """One live server on the embedded tiny model (real Engine), shared by the real-engine tests."""
    from tests.server.needs import server_extra

    server_extra()
    from dsa_runtime.engine import Engine
    from tests.server.live import LiveServer

    # float32: bf16 CPU matmuls round differently for different batch shapes, so a near-tie greedy pick of the
    # random tiny model can flip between batched and single runs (measured: 1 of 32 requests at the engine
    # level); the concurrency test is about the server, not about bf16 batch invariance.
    engine = Engine.from_model(None, dtype="float32", max_total_tokens=16384, max_running_requests=64)
    with LiveServer(engine, served_model_name="tiny") as server:
        yield server
