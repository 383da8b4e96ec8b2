"""Every error case answers the OpenAI error object with the right status, and the server keeps serving."""

from __future__ import annotations

import pytest

from tests.server.needs import server_extra

server_extra()

from tests.server.live import LiveServer, assert_error, sse_events  # noqa: E402
from tests.server.scripted_engine import ScriptedEngine  # noqa: E402

MODEL = "test-model"
OK_BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def _script(prompt: str) -> str:
    if "EXPLODE" in prompt:
        raise ValueError("the scripted engine refuses this prompt")
    return "Hello there, friend."


@pytest.fixture(scope="module")
def srv():
    engine = ScriptedEngine(_script, max_model_len=512)
    with LiveServer(engine, served_model_name=MODEL, max_request_bytes=64 * 1024, api_key="sk-test") as server:
        yield server


def _still_serving(srv) -> None:
    r = srv.client.post("/v1/chat/completions", json=OK_BODY)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Hell"


CASES = {
    "invalid-json": ({"content": b"{not json", "headers": {"content-type": "application/json"}}, 400, None, None),
    "body-not-an-object": ({"json": [1, 2]}, 400, None, None),
    "wrong-type-max-tokens": ({"json": {**OK_BODY, "max_tokens": "5"}}, 400, "max_tokens", None),
    "wrong-type-temperature": ({"json": {**OK_BODY, "temperature": "hot"}}, 400, "temperature", None),
    "wrong-type-messages": ({"json": {**OK_BODY, "messages": "hi"}}, 400, "messages", None),
    "missing-messages": ({"json": {"model": MODEL}}, 400, "messages", None),
    "unknown-model": ({"json": {**OK_BODY, "model": "gpt-9"}}, 404, "model", "model_not_found"),
    "prompt-too-long": (
        {"json": {**OK_BODY, "messages": [{"role": "user", "content": "x" * 600}], "max_tokens": None}},
        400, "messages", "context_length_exceeded",
    ),
    "max-tokens-beyond-context": ({"json": {**OK_BODY, "max_tokens": 100_000}}, 400, "max_tokens",
                                  "context_length_exceeded"),
    "max-tokens-zero": ({"json": {**OK_BODY, "max_tokens": 0}}, 400, "max_tokens", None),
    "n-zero": ({"json": {**OK_BODY, "n": 0}}, 400, "n", None),
    "n-too-large": ({"json": {**OK_BODY, "n": 17}}, 400, "n", None),
    "negative-temperature": ({"json": {**OK_BODY, "temperature": -1}}, 400, None, None),
    "top-logprobs-without-logprobs": ({"json": {**OK_BODY, "top_logprobs": 2}}, 400, "top_logprobs", None),
    "unknown-named-tool": (
        {"json": {**OK_BODY, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}},
        400, "tool_choice", None,
    ),
    "bad-tool-choice-string": ({"json": {**OK_BODY, "tools": TOOLS, "tool_choice": "always"}}, 400, "tool_choice",
                               None),
    "tool-choice-required-without-tools": ({"json": {**OK_BODY, "tool_choice": "required"}}, 400, "tool_choice",
                                           None),
    "bad-message-role": ({"json": {**OK_BODY, "messages": [{"role": "wizard", "content": "x"}]}}, 400, "messages",
                         None),
    "oversized-body": ({"json": {**OK_BODY, "messages": [{"role": "user", "content": "x" * 70_000}]}}, 413, None,
                       "request_too_large"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_error_case_then_next_request_succeeds(srv, case):
    kwargs, status, param, code = CASES[case]
    assert_error(srv.client.post("/v1/chat/completions", **kwargs), status, param, code)
    _still_serving(srv)


def test_oversized_body_without_content_length(srv):
    """A chunked upload is counted while read, not trusted from a header."""
    def body():
        for _ in range(80):
            yield b"x" * 1024

    r = srv.client.post("/v1/chat/completions", content=body(), headers={"content-type": "application/json"})
    assert_error(r, 413, None, "request_too_large")
    _still_serving(srv)


@pytest.mark.parametrize("header", [None, "Bearer sk-wrong", "Bearer sk-tes", "Basic sk-test", "Bearer sk-test-and-more"])
def test_missing_or_wrong_api_key(srv, header):
    headers = {} if header is None else {"Authorization": header}
    with srv.client.__class__(base_url=srv.url, timeout=30, headers=headers) as anonymous:
        assert_error(anonymous.post("/v1/chat/completions", json=OK_BODY), 401, None, "invalid_api_key")
        assert_error(anonymous.get("/v1/models"), 401, None, "invalid_api_key")
        assert anonymous.get("/health").status_code == 200  # probes need no key
    _still_serving(srv)


def test_completions_errors(srv):
    base = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    assert_error(srv.client.post("/v1/completions", json={**base, "prompt": 5}), 400, "prompt", None)
    assert_error(srv.client.post("/v1/completions", json={**base, "prompt": []}), 400, "prompt", None)
    assert_error(srv.client.post("/v1/completions", json={**base, "prompt": [-1, 3]}), 400, "prompt", None)
    assert_error(srv.client.post("/v1/completions", json={**base, "logprobs": 30}), 400, "logprobs", None)
    r = srv.client.post("/v1/completions", json=base)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "He"


def test_error_in_mid_stream_is_an_sse_error_then_done(srv):
    body = {**OK_BODY, "messages": [{"role": "user", "content": "EXPLODE"}], "stream": True}
    with srv.client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        events = list(sse_events(r))
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    error = events[-2]["error"]
    assert set(error) == {"message", "type", "param", "code"} and "refuses" in error["message"]
    _still_serving(srv)


def test_unknown_route_and_method_use_the_error_object(srv):
    assert_error(srv.client.get("/v1/nothing-here"), 404)
    assert_error(srv.client.get("/v1/chat/completions"), 405)
    _still_serving(srv)
