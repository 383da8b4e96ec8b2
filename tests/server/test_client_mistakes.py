"""Client mistakes that used to get a 500 or a wrong 200 (issue 19, section 3) get an OpenAI error object instead.

Each test sends the mistake as the issue describes it, checks the status and the error object, then checks that
an ordinary request right after is answered as usual and promptly.
"""

from __future__ import annotations

import time

import pytest

from tests.server.needs import server_extra

server_extra()

from dsa_runtime.engine import SamplingParams  # noqa: E402
from tests.server.live import LiveServer  # noqa: E402
from tests.server.scripted_engine import ScriptedEngine  # noqa: E402

MODEL = "test-model"
OK_BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
PROMPT_OK_S = 2.0  # a scripted 4-token answer takes milliseconds; this only catches a server left stalled


@pytest.fixture(scope="module")
def srv():
    engine = ScriptedEngine(lambda prompt: "Hello there, friend.")
    with LiveServer(engine, served_model_name=MODEL) as server:
        yield server


def still_serving(srv) -> None:
    """An ordinary chat request right after the mistake gets its usual answer, promptly."""
    start = time.monotonic()
    r = srv.client.post("/v1/chat/completions", json=OK_BODY)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Hell", r.text
    assert time.monotonic() - start < PROMPT_OK_S


# -- temperatures too small to divide by ---------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [0, 0.0, 1e-300, 5e-324, 1e-6, 9.9e-6])
def test_temperatures_below_the_epsilon_are_greedy(temperature):
    assert SamplingParams(temperature=temperature).greedy


@pytest.mark.parametrize("temperature", [1e-5, 0.01, 1.0, 2.0])
def test_temperatures_from_the_epsilon_up_sample(temperature):
    assert not SamplingParams(temperature=temperature).greedy


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-6])
def test_tiny_temperature_answers_like_greedy(real_server, temperature):
    """1e-300 used to overflow the logits to inf and sample garbage with a 200; now it is the argmax answer."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 12,
            "ignore_eos": True, "seed": 3}
    greedy = real_server.client.post("/v1/chat/completions", json={**body, "temperature": 0})
    tiny = real_server.client.post("/v1/chat/completions", json={**body, "temperature": temperature})
    assert greedy.status_code == tiny.status_code == 200, tiny.text
    assert tiny.json()["choices"][0]["message"] == greedy.json()["choices"][0]["message"]
