"""tool_choice required / named / none through the server, with the scripted engine stand-in.

The stand-in sees the prompt text (its tokenizer is lossless), so these tests check that the forced opening
ends the engine's prompt, and it emits only the continuation, so the call the client gets proves the opening
was fed to the parser first. Every case is run whole and streamed.
"""

from __future__ import annotations

import json
import types

import pytest

from tests.server.conftest import calls_of, fold
from tests.server.needs import server_extra

server_extra()

from dsa_runtime.parsers.tool_choice import forced_opening  # noqa: E402
from tests.server.live import LiveServer, stream_chat  # noqa: E402
from tests.server.scripted_engine import CharTokenizer, ScriptedEngine  # noqa: E402

EOS = "<｜end▁of▁sentence｜>"
V32 = types.SimpleNamespace(is_dsa=True)
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
TIME = {"type": "function", "function": {"name": "get_datetime", "parameters": {"type": "object"}}}
ARGS = {"location": "杭州", "days": 3}

# model name, model_config, call format, generation prompt of a non-thinking reply, arguments the model writes
FLAVORS = {
    "v3.2": ("DeepSeek-V3.2", V32, "deepseekv32", "<｜Assistant｜></think>",
             '<｜DSML｜parameter name="location" string="true">杭州</｜DSML｜parameter>\n'
             '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
             f"</｜DSML｜function_calls>{EOS}"),
    "v3.1": ("DeepSeek-V3.1", None, "deepseekv31", "<｜Assistant｜></think>",
             f'{{"location": "杭州", "days": 3}}<｜tool▁call▁end｜><｜tool▁calls▁end｜>{EOS}'),
    "r1": ("DeepSeek-R1-0528", None, "deepseekv3", "<｜Assistant｜>",
           f'{{"location": "杭州", "days": 3}}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>{EOS}'),
}
# What the model writes after a ``required`` opening: a call it picked itself.
PICKED = {
    "deepseekv32": '<｜DSML｜invoke name="get_weather">\n' + FLAVORS["v3.2"][4],
    "deepseekv31": "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>" + FLAVORS["v3.1"][4],
    "deepseekv3": "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n" + FLAVORS["r1"][4],
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _serve(flavor, completion, step_delay_s=0.0, **config):
    name, model_config = FLAVORS[flavor][:2]
    prompts: list[str] = []

    def script(prompt):
        prompts.append(prompt)
        return completion

    engine = ScriptedEngine(script, step_delay_s=step_delay_s)
    engine.model_config = model_config
    return LiveServer(engine, served_model_name=name, **config), prompts


def _body(flavor, **extras):
    return {"model": FLAVORS[flavor][0], "messages": [{"role": "user", "content": "weather?"}], "max_tokens": 500,
            **extras}


@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("mode", ["named", "required"])
@pytest.mark.parametrize("flavor", sorted(FLAVORS))
def test_forced_opening_reaches_the_prompt_and_the_call_comes_back(flavor, mode, thinking):
    _, _, fmt, generation_prompt, arguments = FLAVORS[flavor]
    completion = arguments if mode == "named" else PICKED[fmt]
    server, prompts = _serve(flavor, completion)
    extras = {"tools": [TIME, WEATHER], "tool_choice": NAMED if mode == "named" else "required",
              "chat_template_kwargs": {"thinking": thinking}}
    with server as srv:
        r = srv.client.post("/v1/chat/completions", json=_body(flavor, **extras))
        assert r.status_code == 200, r.text
        whole = r.json()
        events = stream_chat(srv.client, {**_body(flavor, **extras), "stream_options": {"include_usage": True}})
    opening = forced_opening(fmt, "get_weather" if mode == "named" else None)
    assert len(prompts) == 2 and prompts[0] == prompts[1]
    # The opening ends the engine's prompt, after the non-thinking generation prompt (thinking is off).
    assert prompts[0].endswith(generation_prompt + opening)
    assert ("get_datetime" in prompts[0]) == (mode == "required")  # a named choice shows only its tool
    choice = whole["choices"][0]
    message = choice["message"]
    assert calls_of(message) == [("get_weather", ARGS)] and choice["finish_reason"] == "tool_calls"
    assert (message["content"], message["reasoning_content"]) == (None, None)
    streamed = fold(events)
    assert calls_of(streamed) == [("get_weather", ARGS)] and streamed["finish_reason"] == "tool_calls"
    assert (streamed["content"], streamed["reasoning_content"]) == ("", "")
    assert streamed["calls"][0]["arguments"] == message["tool_calls"][0]["function"]["arguments"]
    # The opening is prompt: counted in prompt_tokens; completion_tokens are what the model generated.
    tok = CharTokenizer()
    usage = {"prompt_tokens": len(tok.encode(prompts[0])), "completion_tokens": len(tok.encode(completion)) - 1}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    usage["prompt_tokens_details"] = {"cached_tokens": 0}  # the scripted engine has no prefix cache
    assert whole["usage"] == streamed["usage"] == usage
    if mode == "named":  # the header is known from the opening: it is the chunk right after the role
        header = events[1]["choices"][0]["delta"]["tool_calls"][0]
        assert header["function"] == {"name": "get_weather", "arguments": ""} and header["id"].startswith("call_")


@pytest.mark.parametrize("flavor,expected", [("v3.2", "{}"), ("v3.1", "it is sunny"), ("r1", "it is sunny")])
def test_named_call_the_model_never_closes_is_still_that_call(flavor, expected):
    """A model that writes garbage after the opening and stops: the call is closed at the stop (DSML drops
    stray text inside an invoke; V3 / V3.1 arguments are kept verbatim and counted as a parse error)."""
    server, _ = _serve(flavor, f"it is sunny{EOS}")
    body = _body(flavor, tools=[WEATHER], tool_choice=NAMED)
    with server as srv:
        message = srv.client.post("/v1/chat/completions", json=body).json()["choices"][0]
        streamed = fold(stream_chat(srv.client, body))
        errors = srv.metric("dsa:tool_call_parse_errors_total")
    got = [(c["function"]["name"], c["function"]["arguments"]) for c in message["message"]["tool_calls"]]
    assert got == [("get_weather", expected)] == [(c["name"], c["arguments"]) for c in streamed["calls"]]
    assert message["finish_reason"] == streamed["finish_reason"] == "tool_calls"
    assert errors == (0 if expected == "{}" else 2)


@pytest.mark.parametrize("flavor", sorted(FLAVORS))
def test_forced_call_cut_by_max_tokens_is_length_without_a_call(flavor):
    """As for any call cut off by the length limit: finish_reason length, the open call is not returned whole
    (its arguments would be cut mid-value); the stream's header delta has gone out."""
    server, _ = _serve(flavor, FLAVORS[flavor][4])
    body = {**_body(flavor, tools=[WEATHER], tool_choice=NAMED), "max_tokens": 4}
    with server as srv:
        choice = srv.client.post("/v1/chat/completions", json=body).json()["choices"][0]
        streamed = fold(stream_chat(srv.client, body))
    assert choice["finish_reason"] == streamed["finish_reason"] == "length"
    assert "tool_calls" not in choice["message"]
    assert [c["name"] for c in streamed["calls"]] == ["get_weather"]


def test_n_choices_each_open_with_the_named_call():
    server, _ = _serve("v3.2", FLAVORS["v3.2"][4])
    body = {**_body("v3.2", tools=[WEATHER], tool_choice=NAMED), "n": 3}
    with server as srv:
        whole = srv.client.post("/v1/chat/completions", json=body).json()
        events = stream_chat(srv.client, body)
    assert [calls_of(c["message"]) for c in whole["choices"]] == [[("get_weather", ARGS)]] * 3
    headers = {}
    for e in events[:-1]:
        for tc in e["choices"][0]["delta"].get("tool_calls", []):
            if "id" in tc:
                headers.setdefault(e["choices"][0]["index"], []).append(tc["function"]["name"])
    assert headers == {0: ["get_weather"], 1: ["get_weather"], 2: ["get_weather"]}


@pytest.mark.parametrize("thinking", [False, True])
def test_tool_choice_none_hides_tools_and_parses_no_call_streamed_or_whole(thinking):
    markup = '\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>'
    completion = ("why</think>" if thinking else "") + "Calling:" + markup
    server, prompts = _serve("v3.2", completion)
    body = _body("v3.2", tools=[WEATHER], tool_choice="none", chat_template_kwargs={"thinking": thinking})
    with server as srv:
        choice = srv.client.post("/v1/chat/completions", json=body).json()["choices"][0]
        streamed = fold(stream_chat(srv.client, body))
    assert "get_weather" not in prompts[0] and "## Tools" not in prompts[0]
    assert prompts[0].endswith("<think>" if thinking else "</think>")  # thinking is only turned off when forced
    assert choice["message"]["content"] == streamed["content"] == "Calling:" + markup
    assert "tool_calls" not in choice["message"] and streamed["calls"] == []
    assert choice["finish_reason"] == streamed["finish_reason"] == "stop"
    assert (choice["message"]["reasoning_content"], streamed["reasoning_content"] or None) == (
        ("why", "why") if thinking else (None, None))


@pytest.mark.parametrize("choice", ["required", NAMED])
def test_forcing_needs_a_tool_parser(choice):
    server, prompts = _serve("v3.2", "ok", tool_call_parser="none")
    with server as srv:
        r = srv.client.post("/v1/chat/completions", json=_body("v3.2", tools=[WEATHER], tool_choice=choice))
        assert r.status_code == 400
        error = r.json()["error"]
        assert error["param"] == "tool_choice" and "--tool-call-parser none" in error["message"]
        ok = srv.client.post("/v1/chat/completions", json=_body("v3.2", tools=[WEATHER], tool_choice="auto"))
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "ok"
    assert len(prompts) == 1


def test_forced_arguments_stream_as_fragments():
    """The client gets the model's argument text in pieces, after the header the opening produced (steps paced
    so that the stream does not merge them all: a consumer that falls behind gets queued steps as one chunk)."""
    server, _ = _serve("v3.1", FLAVORS["v3.1"][4], step_delay_s=0.01)
    with server as srv:
        events = stream_chat(srv.client, _body("v3.1", tools=[WEATHER], tool_choice=NAMED))
    fragments = [tc["function"]["arguments"] for e in events[:-1] if e["choices"]
                 for tc in e["choices"][0]["delta"].get("tool_calls", []) if "id" not in tc]
    assert len(fragments) > 1 and json.loads("".join(fragments)) == ARGS
