"""The engine in its own process (``--engine-process``): the proxy's Engine interface, refusals, outputs put back
together, a child that dies, and ``serve`` on it end to end with a SIGTERM drain."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import threading
import time

import pytest

from tests.server.needs import server_extra

server_extra()

import httpx  # noqa: E402

from dsa_runtime.engine import EngineConfig, SamplingParams  # noqa: E402
from dsa_runtime.engine.engine_process import EngineProcess, EngineProcessError  # noqa: E402
from tests.engine.helpers import run_all  # noqa: E402
from tests.server.live import LiveServer, sse_events, start_serve  # noqa: E402
from tests.server.scripted_engine import ScriptedReply, build_scripted  # noqa: E402


@pytest.fixture(scope="module")
def proxy():
    engine = EngineProcess(EngineConfig(max_running_requests=4))
    yield engine
    engine.close()


def test_outputs_match_the_in_process_engine(proxy):
    from dsa_runtime.engine import Engine

    prompt = proxy.tokenizer.encode("What is 47 + 38?")
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    proxy.add_request("a", prompt, params)
    outs = run_all(proxy, max_steps=2000)["a"]
    local = Engine(EngineConfig(max_running_requests=4))
    local.add_request("a", prompt, params)
    want = []
    while local.has_unfinished():
        want.extend(local.step())
    # The proxy may merge steps that arrived together (one output per request per read): compare the deltas joined.
    assert [t for o in outs for t in o.new_token_ids] == [t for o in want for t in o.new_token_ids]
    assert all(o.token_ids == want[-1].token_ids[: len(o.token_ids)] for o in outs)
    assert outs[-1].token_ids == want[-1].token_ids and outs[-1].prompt_token_ids == prompt
    assert "".join(o.new_text for o in outs) == want[-1].text == outs[-1].text and outs[-1].finish_reason == "length"
    assert proxy.max_model_len == local.max_model_len and proxy.stats().pages_used == 0
    assert [(lp.token_id, lp.top) for o in outs for lp in o.logprobs] == [
        (lp.token_id, lp.top) for o in want for lp in o.logprobs]
    stamps = outs[-1].metrics
    assert stamps.arrival <= stamps.first_token <= stamps.last_token <= stamps.finished


def test_the_proxy_reports_the_engines_checkpoint_and_kernels(proxy):
    from dsa_runtime.engine import Engine
    from dsa_runtime.families import METHODS
    from dsa_runtime.loader.default_model import embedded_model_path

    local = Engine(EngineConfig(max_running_requests=4))
    assert local.model_path == str(embedded_model_path()) == proxy.model_path
    assert proxy.kernel_log == local.kernel_log
    head, *kernels = local.kernel_log
    assert head.startswith("platform ") and ", KV layout " in head
    # One line per method of every family, in contract order, each naming its backend and why.
    assert [line.split(":")[0] for line in kernels] == [f"kernel {m}" for m in METHODS]
    assert all(line.endswith(")") and " (" in line for line in kernels)


def test_a_late_read_gets_one_merged_output_per_request(proxy):
    """Steps that queued while nobody read come back as one output per request: the deltas, logprobs and text of
    every step joined in order, totals and finish state of the last, and a refusal still as its error."""
    from dsa_runtime.engine import Engine

    rng = random.Random(7)
    prompts = {rid: [rng.randrange(10, proxy.tokenizer.vocab_size) for _ in range(rng.randrange(3, 20))]
               for rid in ("x", "y")}
    params = {"x": SamplingParams(temperature=0, max_tokens=9, ignore_eos=True, logprobs=1),
              "y": SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)}
    for rid in ("x", "y"):
        proxy.add_request(rid, prompts[rid], params[rid])
    proxy.add_request("too-long", [5] * (proxy.max_model_len + 1), SamplingParams(max_tokens=2))
    time.sleep(3.0)  # the child runs ahead: several steps wait in the pipe
    first = proxy.step()
    refused = [o for o in first if isinstance(o, Exception)]
    assert [e.request_id for e in refused] == ["too-long"]
    outs = {rid: [] for rid in ("x", "y")}
    for out in first:
        if not isinstance(out, Exception):
            outs[out.request_id].append(out)
    assert all(len(v) <= 1 for v in outs.values())  # one output per request per read
    assert max(len(v[0].new_token_ids) for v in outs.values() if v) > 1  # steps were merged
    for rid, got in run_all(proxy, max_steps=2000).items():
        outs[rid] += got
    local = Engine(EngineConfig(max_running_requests=4))
    for rid in ("x", "y"):
        local.add_request(rid, prompts[rid], params[rid])
    want = {rid: [] for rid in ("x", "y")}
    while local.has_unfinished():
        for out in local.step():
            want[out.request_id].append(out)
    for rid in ("x", "y"):
        got = outs[rid]
        assert [t for o in got for t in o.new_token_ids] == want[rid][-1].token_ids == got[-1].token_ids
        assert "".join(o.new_text for o in got) == want[rid][-1].text == got[-1].text
        assert [lp.token_id for o in got for lp in o.logprobs] == [lp.token_id for o in want[rid] for lp in o.logprobs]
        assert got[-1].finished and got[-1].finish_reason == "length" and not any(o.finished for o in got[:-1])


def test_a_refused_request_comes_back_as_its_error_and_aborts_work(proxy):
    proxy.add_request("long", [5] * (proxy.max_model_len + 10), SamplingParams(max_tokens=4))
    got = []
    for _ in range(200):
        got.extend(proxy.step())
        if got:
            break
    assert len(got) == 1 and isinstance(got[0], ValueError) and got[0].request_id == "long"
    assert "max_model_len" in str(got[0]) and not proxy.has_unfinished()
    with pytest.raises(ValueError, match="already running"):
        proxy.add_request("x", [5, 6], SamplingParams(max_tokens=50, ignore_eos=True))
        proxy.add_request("x", [5, 6], SamplingParams(max_tokens=50))
    proxy.abort("x")
    outs = run_all(proxy, max_steps=2000)["x"]
    assert outs[-1].finish_reason == "abort"


def test_a_dead_engine_process_is_an_error_not_a_hang():
    engine = EngineProcess(EngineConfig(max_running_requests=2))
    engine.add_request("a", [5, 6, 7], SamplingParams(max_tokens=500, ignore_eos=True))
    engine._proc.kill()
    engine._proc.join(10)
    with pytest.raises(EngineProcessError, match="died"):
        for _ in range(100):
            engine.step()
    engine.close()
    assert not engine._proc.is_alive()


def test_an_engine_process_that_dies_mid_stream_ends_the_streams_and_health():
    """The event loop reads the child's pipe (AsyncEngineProcess): the child's death ends every open stream with
    an error event and [DONE], /health turns 503 and new requests get a 503 error object."""
    from dsa_runtime.engine.async_engine_process import AsyncEngineProcess

    engine = EngineProcess(ScriptedReply("w" * 2000, step_delay_s=0.005), build=build_scripted)
    with LiveServer(engine, served_model_name="m") as srv:
        assert isinstance(srv.state.engine, AsyncEngineProcess)
        events: list = []
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1500, "stream": True}
        assert os.get_blocking(engine.fileno())
        with srv.client.stream("POST", "/v1/chat/completions", json=body) as r:
            for event in sse_events(r):
                events.append(event)
                if len(events) == 5:  # tokens flow: kill the child
                    engine._proc.kill()
        assert events[-1] == "[DONE]" and "engine" in events[-2]["error"]["message"]
        assert all(e["choices"][0]["finish_reason"] is None for e in events[:-2])
        deadline = time.monotonic() + 10
        while srv.client.get("/health").status_code == 200:
            assert time.monotonic() < deadline, "/health still 200 after the engine process died"
            time.sleep(0.02)
        new = srv.client.post("/v1/chat/completions", json={**body, "stream": False})
        assert new.status_code == 503 and new.json()["error"]["type"] == "server_error"


def test_messages_larger_than_the_pipe_buffer_cross_whole_under_concurrent_streams():
    """Prompts of hundreds of KB go down, and outputs of 48 streams at once come up, through the pipe the event
    loop watches (which must stay blocking: uvloop makes a watched descriptor non-blocking, and a half-written
    or half-read message then failed the engine)."""
    rng = random.Random(3)
    engine = EngineProcess(ScriptedReply("ab" * 100, step_delay_s=0.002, max_model_len=400_000, num_pages=20_000),
                           build=build_scripted)
    with LiveServer(engine, served_model_name="m") as srv:
        assert os.get_blocking(engine.fileno())
        long_prompt = "".join(rng.choice("xyz ") for _ in range(150_000))

        async def run() -> list[str]:
            async def one(i: int) -> str:
                content = long_prompt if i == 0 else f"q{i}"
                body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 150,
                        "stream": True}
                text = []
                async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            event = json.loads(line[6:])
                            assert "error" not in event, event
                            text.append(event["choices"][0]["delta"].get("content") or "")
                return "".join(text)

            async with httpx.AsyncClient(base_url=srv.url, timeout=120) as client:
                return await asyncio.gather(*(one(i) for i in range(48)))

        assert asyncio.run(run()) == [("ab" * 100)[:150]] * 48
        assert srv.state.engine.is_running


def test_serve_on_an_engine_process_streams_and_drains_on_sigterm():
    proc, url = start_serve(
        "from dsa_runtime.engine import EngineConfig; from dsa_runtime.engine.engine_process import EngineProcess;"
        " engine = EngineProcess(EngineConfig(max_running_requests=8))",
        drain_timeout=30.0,
    )
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            assert client.get("/v1/models").json()["data"][0]["id"] == "tiny-chat"
            body = {"model": "tiny-chat", "messages": [{"role": "user", "content": "What is 47 + 38?"}],
                    "max_tokens": 40, "temperature": 0}
            answer = client.post("/v1/chat/completions", json=body).json()
            assert "85" in answer["choices"][0]["message"]["content"]
            events: list = []

            def consume():
                with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True,
                                                                           "max_tokens": 200}) as r:
                    events.extend(sse_events(r))

            reader = threading.Thread(target=consume)
            reader.start()
            while not events and reader.is_alive():
                reader.join(0.05)
            proc.send_signal(signal.SIGTERM)
            reader.join(60)
        assert proc.wait(60) == 0
        assert events[-1] == "[DONE]"
        assert any(e["choices"][0]["finish_reason"] for e in events if isinstance(e, dict) and e.get("choices"))
    finally:
        if proc.poll() is None:
            proc.kill()
