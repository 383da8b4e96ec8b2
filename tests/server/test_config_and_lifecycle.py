"""``dsa-runtime serve`` flags, parser defaults per model, side endpoints, and SIGTERM drain in a subprocess."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import subprocess
import threading
import time
import types

import pytest

from dsa_runtime.cli.main import main as cli_main
from dsa_runtime.errors import ConfigError
from dsa_runtime.server.config import (
    ServerConfig,
    add_server_arguments,
    detect_flavor,
    server_config_from_args,
)
from tests.server.needs import server_extra

server_extra()

import httpx  # noqa: E402

from tests.server.live import LiveServer, assert_error, sse_events, start_serve  # noqa: E402
from tests.server.scripted_engine import ScriptedEngine  # noqa: E402


def _parse(argv: list[str]) -> ServerConfig:
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    return server_config_from_args(parser.parse_args(argv))


def test_defaults_are_loopback_on_sglang_port():
    config = _parse([])
    assert (config.host, config.port, config.api_key, config.engine.tp) == ("127.0.0.1", 30000, None, 1)
    assert config.engine.model is None and config.engine.max_running_requests == 64


def test_sglang_flag_names_and_nsa_aliases_reach_the_configs():
    config = _parse([
        "--host", "0.0.0.0", "--port", "8123", "--api-key", "k", "--served-model-name", "ds",
        "--tool-call-parser", "deepseekv31", "--reasoning-parser", "deepseek-r1", "--reasoning-field-alias",
        "--max-running-requests", "7", "--kv-cache-dtype", "fp8_e4m3", "--page-size", "64",
        "--mem-fraction-static", "0.5", "--chunked-prefill-size", "512", "--tp", "1",
        "--nsa-prefill-backend", "reference", "--dsa-decode-backend", "reference", "--nsa-topk-backend", "reference",
    ])
    assert (config.host, config.port, config.api_key, config.served_model_name) == ("0.0.0.0", 8123, "k", "ds")
    assert (config.tool_call_parser, config.reasoning_parser, config.reasoning_field_alias) == (
        "deepseekv31", "deepseek-r1", True,
    )
    e = config.engine
    assert (e.max_running_requests, e.kv_cache_dtype, e.page_size, e.mem_fraction_static, e.chunked_prefill_size) == (
        7, "fp8_e4m3", 64, 0.5, 512,
    )
    assert (e.dsa_prefill_backend, e.dsa_decode_backend, e.dsa_topk_backend) == ("reference",) * 3


def test_bad_parallel_layout_is_a_clear_error(capsys):
    """--tp / --dp are engine flags (tensor parallelism); a layout that cannot split is one line."""
    assert cli_main(["serve", "--tp", "4", "--dp", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--enable-dp-attention" in err
    config = _parse(["--tp", "4", "--dp", "2", "--enable-dp-attention", "--nnodes", "2", "--node-rank", "1",
                     "--dist-init-addr", "10.0.0.1:5000"])
    assert config.engine.parallel().attn_size == 2 and config.engine.parallel().ranks_per_node == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--port", "70000"], "--port"), (["--kv-cache-dtype", "fp4"], "invalid choice")],
)
def test_bad_flag_values_are_refused(argv, message, capsys):
    with pytest.raises((ConfigError, SystemExit)) as info:
        _parse(argv)
    text = str(info.value) if isinstance(info.value, ConfigError) else capsys.readouterr().err
    assert message in text


@pytest.mark.parametrize(
    ("is_dsa", "name", "family", "tool", "reasoning"),
    [
        (True, "deepseek-ai/DeepSeek-V3.2", "v3.2", "deepseekv32", "deepseek-v3"),
        (True, "tiny-v32", "v3.2", "deepseekv32", "deepseek-v3"),
        (True, "DeepSeek-V3.2-Exp", "v3.2-exp", "deepseekv31", "deepseek-v3"),
        (False, "DeepSeek-V3.1-Terminus", "v3.1", "deepseekv31", "deepseek-v3"),
        (False, "/models/DeepSeek-R1-0528", "r1", "deepseekv3", "deepseek-r1"),
        (False, "DeepSeek-V3-0324", "v3", "deepseekv3", None),
    ],
)
def test_parser_defaults_follow_the_model(is_dsa, name, family, tool, reasoning):
    flavor = detect_flavor(types.SimpleNamespace(is_dsa=is_dsa), name)
    assert (flavor.family, flavor.tool_parser, flavor.reasoning_parser) == (family, tool, reasoning)


def test_explicit_parser_flags_win_and_unknown_names_fail_at_start():
    engine = ScriptedEngine(lambda p: "x")
    engine.model_config = types.SimpleNamespace(is_dsa=True)
    with LiveServer(engine, tool_call_parser="none", reasoning_parser="deepseek-r1") as srv:
        assert (srv.state.tool_parser, srv.state.reasoning_parser) == (None, "deepseek-r1")
    with pytest.raises(ConfigError, match="unknown tool parser 'qwen'"):
        LiveServer(ScriptedEngine(lambda p: "x"), tool_call_parser="qwen")


def test_binding_beyond_loopback_without_key_warns(caplog):
    from dsa_runtime.server.launch import warn_if_exposed

    with caplog.at_level(logging.WARNING, logger="dsa_runtime.server"):
        assert warn_if_exposed(ServerConfig(host="0.0.0.0"))
    assert "without --api-key" in caplog.text
    assert not warn_if_exposed(ServerConfig(host="0.0.0.0", api_key="k"))
    assert not warn_if_exposed(ServerConfig())


def test_side_endpoints():
    engine = ScriptedEngine(lambda p: "pong")
    engine.model_config = types.SimpleNamespace(is_dsa=True)
    with LiveServer(engine, served_model_name="m") as srv:
        c = srv.client
        assert c.get("/health").status_code == 200
        assert c.get("/health_generate").status_code == 200
        tok = c.post("/tokenize", json={"prompt": "héllo"}).json()
        assert tok["count"] == 5 and tok["max_model_len"] == 4096
        assert c.post("/detokenize", json={"tokens": tok["tokens"]}).json() == {"prompt": "héllo"}
        chat = c.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
        assert c.post("/detokenize", json={"tokens": chat["tokens"]}).json()["prompt"].endswith(
            "<｜User｜>hi<｜Assistant｜></think>"
        )
        assert c.post("/detokenize", json={"tokens": [-3]}).status_code == 400
        assert c.post("/tokenize", json={}).status_code == 400
        card = c.get("/v1/models").json()["data"][0]
        assert (card["id"], card["object"], card["max_model_len"]) == ("m", "model", 4096)
        c.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 3})
        metrics = c.get("/metrics").text
        for name in ("dsa:time_to_first_token_seconds", "dsa:inter_token_latency_seconds",
                     "dsa:e2e_request_latency_seconds", "dsa:request_queue_time_seconds",
                     "dsa:num_requests_running", "dsa:num_requests_waiting", "dsa:kv_cache_usage_perc",
                     "dsa:prompt_tokens_total", "dsa:generation_tokens_total", "dsa:request_success_total",
                     "dsa:num_aborted_requests_total", "dsa:tool_call_parse_errors_total"):
            assert f"# TYPE {name}" in metrics or f"# TYPE {name.removesuffix('_total')}" in metrics, name
        assert srv.metric("dsa:generation_tokens_total") == 3
        assert 'dsa:request_success_total{finished_reason="length",model_name="m"} 1.0' in metrics


def test_health_reports_a_dead_engine():
    class Broken(ScriptedEngine):
        def step(self):
            raise RuntimeError("device lost")

    with LiveServer(Broken(lambda p: "x")) as srv:
        assert srv.client.get("/health_generate").status_code == 503
        assert srv.client.get("/health").status_code == 503
        r = srv.client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"


_SLOW_Y = ("from tests.server.scripted_engine import ScriptedEngine; "
           "engine = ScriptedEngine(lambda prompt: 'y' * 300, step_delay_s=0.01)")


def _start(drain: float) -> tuple[subprocess.Popen, str]:
    return start_serve(_SLOW_Y, drain_timeout=drain, served_model_name="m")


@pytest.mark.parametrize(("drain", "max_tokens", "finish"), [(30.0, 40, "length"), (0.3, 300, None)])
def test_sigterm_drains_then_aborts_and_exits_zero(drain, max_tokens, finish):
    """A request shorter than the grace period completes; a longer one is cut; the process exits 0."""
    proc, url = _start(drain)
    events: list = []
    started = threading.Event()
    try:
        def consume():
            body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": max_tokens,
                    "stream": True}
            with httpx.Client(base_url=url, timeout=60) as client, client.stream(
                "POST", "/v1/chat/completions", json=body
            ) as r:
                try:
                    for event in sse_events(r):
                        events.append(event)
                        if isinstance(event, dict) and event.get("choices") and \
                                event["choices"][0]["delta"].get("content"):
                            started.set()
                except httpx.HTTPError:
                    events.append("cut")
                finally:
                    started.set()

        reader = threading.Thread(target=consume)
        reader.start()
        # The signal comes once tokens flow (the engine has the request), however loaded the machine is; the
        # role chunk alone comes before the request reaches the engine.
        assert started.wait(60)
        proc.send_signal(signal.SIGTERM)
        reader.join(60)
        assert proc.wait(60) == 0
        output = proc.stdout.read()
        assert "server stopped" in output
    finally:
        if proc.poll() is None:
            proc.kill()
    finishes = [e["choices"][0]["finish_reason"] for e in events if isinstance(e, dict) and e.get("choices")
                and e["choices"][0]["finish_reason"]]
    assert events[-1] == "[DONE]" and events[0]["choices"][0]["delta"]["role"] == "assistant"
    if finish is None:  # cut short after it had started: an error event says why
        assert finishes == [] and "shutting down" in events[-2]["error"]["message"]
    else:
        assert finishes == [finish]


def test_sigterm_drain_answers_new_requests_503_until_the_listener_closes():
    """New connections during the drain get a 503 error object (they used to be refused at the TCP level), and
    /health says 503 so a load balancer takes the replica out; the request already running finishes."""
    proc, url = _start(30.0)
    events: list = []
    first_chunk = threading.Event()
    try:
        def consume():
            body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 120,
                    "stream": True}  # 120 scripted steps of 10 ms: ~1.2 s
            with httpx.Client(base_url=url, timeout=60) as client, client.stream(
                "POST", "/v1/chat/completions", json=body
            ) as r:
                for event in sse_events(r):
                    events.append(event)
                    first_chunk.set()

        reader = threading.Thread(target=consume)
        reader.start()
        assert first_chunk.wait(30), "the stream did not start"
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while (health := httpx.get(url + "/health", timeout=10)).status_code == 200:  # until the signal lands
            assert time.monotonic() < deadline, "/health still 200 after SIGTERM"
            time.sleep(0.01)
        assert_error(health, 503, None, "service_unavailable")
        assert health.headers["connection"] == "close"
        new = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                         timeout=10)  # a new connection, as every httpx.post is
        err = assert_error(new, 503, None, "service_unavailable")
        assert err["type"] == "server_error" and "shutting down" in err["message"]
        assert reader.is_alive(), "the drain was checked after the running request had already finished"
        reader.join(60)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    finishes = [e["choices"][0]["finish_reason"] for e in events if isinstance(e, dict) and e.get("choices")
                and e["choices"][0]["finish_reason"]]
    assert events[-1] == "[DONE]" and finishes == ["length"]
    with pytest.raises(httpx.ConnectError):  # the listener closed once the drain was over
        httpx.get(url + "/health", timeout=5)


def test_a_second_sigint_during_the_drain_exits_at_once():
    engine = ("from tests.server.scripted_engine import ScriptedEngine; "
              "engine = ScriptedEngine(lambda prompt: 'y' * 300, step_delay_s=0.05)")  # a 15 s stream
    proc, url = start_serve(engine, drain_timeout=60.0, served_model_name="m")
    started = threading.Event()
    try:
        def consume():
            body = {"messages": [{"role": "user", "content": "x"}], "stream": True}
            with contextlib.suppress(httpx.HTTPError), httpx.Client(base_url=url, timeout=60) as client, \
                    client.stream("POST", "/v1/chat/completions", json=body) as r:
                for _ in r.iter_lines():
                    started.set()

        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        assert started.wait(30), "the stream did not start"
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 5
        while httpx.get(url + "/health", timeout=10).status_code == 200:  # draining: the first one landed
            assert time.monotonic() < deadline
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        proc.wait(30)
        assert time.monotonic() - start < 5, "the second SIGINT did not cut the 60 s drain short"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_engine_process_is_the_default_on_one_cuda_device_only():
    from dsa_runtime.engine import EngineConfig

    def uses(flag=None, **engine):
        return ServerConfig(engine_process=flag, engine=EngineConfig(**engine)).uses_engine_process()

    assert uses(device="cuda") and uses(device="cuda:1")
    assert not uses(device="cpu") and not uses(device="cuda", tp=2)
    assert uses(True, device="cpu") and not uses(False, device="cuda")
    assert _parse(["--no-engine-process"]).engine_process is False
    assert _parse(["--engine-process"]).engine_process is True and _parse([]).engine_process is None
