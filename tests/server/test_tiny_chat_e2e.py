"""End to end: ``dsa-runtime serve`` on the embedded trained model, driven by the openai client.

A weather question with a ``get_weather`` tool comes back as ``tool_calls`` naming the city, streamed and
not streamed; a thinking-mode arithmetic question returns ``reasoning_content`` and the right answer.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from tests.server.needs import server_extra

server_extra()
openai = pytest.importorskip("openai")

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served():
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsa_runtime.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--served-model-name", "tiny-chat"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
    )
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=60)
    deadline = time.monotonic() + 90
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"serve exited with {proc.returncode}: {proc.stdout.read()[-2000:]}")
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                if time.monotonic() > deadline:
                    raise RuntimeError("serve did not start in 90 s") from None
                time.sleep(0.3)
        yield client
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


ASK = [{"role": "user", "content": "What's the weather like in Paris?"}]


def test_weather_question_returns_a_get_weather_tool_call(served):
    r = served.chat.completions.create(model="tiny-chat", messages=ASK, tools=[WEATHER_TOOL], temperature=0,
                                       max_tokens=120)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.id


def test_weather_question_streamed_returns_the_same_tool_call(served):
    stream = served.chat.completions.create(model="tiny-chat", messages=ASK, tools=[WEATHER_TOOL], temperature=0,
                                            max_tokens=120, stream=True)
    names, args, finish = {}, {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        finish = ch.finish_reason or finish
        for tc in ch.delta.tool_calls or []:
            if tc.function and tc.function.name:
                names[tc.index] = tc.function.name
            if tc.function and tc.function.arguments:
                args[tc.index] = args.get(tc.index, "") + tc.function.arguments
    assert finish == "tool_calls"
    assert names == {0: "get_weather"}
    assert json.loads(args[0]) == {"city": "Paris"}


def test_thinking_question_returns_reasoning_and_the_answer(served):
    r = served.chat.completions.create(
        model="tiny-chat", messages=[{"role": "user", "content": "What is 47 + 38?"}], temperature=0,
        max_tokens=120, extra_body={"chat_template_kwargs": {"thinking": True}},
    )
    msg = r.choices[0].message
    reasoning = getattr(msg, "reasoning_content", None) or (msg.model_extra or {}).get("reasoning_content")
    assert reasoning and "47" in reasoning
    assert msg.content and "85" in msg.content
    assert r.choices[0].finish_reason == "stop"
