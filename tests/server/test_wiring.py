"""Tool-call and reasoning wiring end to end, with a scripted engine that emits given completions.

Each case is run whole and streamed; both must carry exactly the expected content, reasoning, calls and
finish reason (the stream folded back chunk by chunk, its shapes checked on the way).
"""

from __future__ import annotations

import json
import types

import pytest

from tests.server.conftest import calls_of, fold
from tests.server.needs import server_extra

server_extra()

from tests.server.live import LiveServer, stream_chat  # noqa: E402
from tests.server.scripted_engine import ScriptedEngine  # noqa: E402

D = "｜DSML｜"
EOS = "<｜end▁of▁sentence｜>"
CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
FC, FCE, IE, PE = f"<{D}function_calls>", f"</{D}function_calls>", f"</{D}invoke>", f"</{D}parameter>"


def I(name):  # noqa: E743 - one letter keeps the scripted completions short
    return f'<{D}invoke name="{name}">'


def P(key, string):
    return f'<{D}parameter name="{key}" string="{string}">'


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "weather",
                                            "parameters": {"type": "object", "properties": {}}}}
TIME = {"type": "function", "function": {"name": "get_datetime", "parameters": {"type": "object"}}}

V32 = types.SimpleNamespace(is_dsa=True)

# id: (model name, model_config, request extras, completion, content, reasoning, calls, finish)
CASES = {
    "v32-chat-call": (
        "DeepSeek-V3.2", V32, {"tools": [WEATHER]},
        f"Let me check.\n\n{FC}\n{I('get_weather')}\n{P('location', 'true')}Hangzhou{PE}\n"
        f"{P('date', 'true')}2024-01-16{PE}\n{IE}\n{FCE}{EOS}",
        "Let me check.", None, [("get_weather", {"location": "Hangzhou", "date": "2024-01-16"})], "tool_calls",
    ),
    "v32-two-calls-typed": (
        "DeepSeek-V3.2", V32, {"tools": [WEATHER]},
        f"\n\n{FC}\n{I('get_weather')}\n{P('location', 'true')}杭州🌤️{PE}\n{IE}\n{I('get_weather')}\n"
        f"{P('days', 'false')}3{PE}\n{P('opts', 'false')}{{\"a\": [1, null]}}{PE}\n{IE}\n{FCE}",
        None, None, [("get_weather", {"location": "杭州🌤️"}), ("get_weather", {"days": 3, "opts": {"a": [1, None]}})],
        "tool_calls",
    ),
    "v32-thinking-then-call": (
        "DeepSeek-V3.2", V32, {"tools": [TIME], "chat_template_kwargs": {"thinking": True}},
        f"需要日期📅</think>\n\n{FC}\n{I('get_datetime')}\n{P('timezone', 'true')}Asia/Shanghai{PE}\n{IE}\n{FCE}{EOS}",
        None, "需要日期📅", [("get_datetime", {"timezone": "Asia/Shanghai"})], "tool_calls",
    ),
    "v32-reasoning-effort-maps-to-thinking": (
        "DeepSeek-V3.2", V32, {"reasoning_effort": "high"},
        f"Reasoning here.</think>Final answer.{EOS}", "Final answer.", "Reasoning here.", [], "stop",
    ),
    "v32-no-thinking-all-content": (
        "DeepSeek-V3.2", V32, {}, "Plain 5 < 6 answer.", "Plain 5 < 6 answer.", None, [], "stop",
    ),
    "v31-two-calls": (
        "DeepSeek-V3.1", None, {"tools": [WEATHER]},
        f'{CALLS_BEGIN}{CALL_BEGIN}get_weather{SEP}{{"location": "Tokyo"}}{CALL_END}{CALL_BEGIN}get_weather{SEP}'
        f'{{"location": "Paris"}}{CALL_END}{CALLS_END}{EOS}',
        None, None, [("get_weather", {"location": "Tokyo"}), ("get_weather", {"location": "Paris"})], "tool_calls",
    ),
    "r1-reasoning-verbatim-content": (
        "DeepSeek-R1", None, {}, "Okay, 2+2.</think>\n\nThe answer is 4.", "\n\nThe answer is 4.", "Okay, 2+2.", [],
        "stop",
    ),
    "r1-fenced-call": (
        "DeepSeek-R1-0528", None, {"tools": [WEATHER]},
        f'<think>plan</think>\n\n{CALLS_BEGIN}{CALL_BEGIN}function{SEP}get_weather\n```json\n{{"location": "Tokyo"}}\n```'
        f"{CALL_END}{CALLS_END}",
        None, "plan", [("get_weather", {"location": "Tokyo"})], "tool_calls",
    ),
}


def _serve(name, model_config, completion, **config):
    prompts = []

    def script(prompt):
        prompts.append(prompt)
        return completion

    engine = ScriptedEngine(script)
    engine.model_config = model_config
    return LiveServer(engine, served_model_name=name, **config), prompts


def _body(name, extras):
    return {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000, **extras}


@pytest.mark.parametrize("case", sorted(CASES))
def test_scripted_completion_whole_and_streamed(case):
    name, model_config, extras, completion, content, reasoning, calls, finish = CASES[case]
    server, _ = _serve(name, model_config, completion)
    with server as srv:
        r = srv.client.post("/v1/chat/completions", json=_body(name, extras))
        assert r.status_code == 200, r.text
        whole = r.json()
        choice = whole["choices"][0]
        message = choice["message"]
        assert (message["content"], message["reasoning_content"], calls_of(message), choice["finish_reason"]) == (
            content, reasoning, calls, finish,
        )
        assert ("tool_calls" in message) == bool(calls)
        assert whole["usage"]["completion_tokens"] > 0
        assert whole["usage"]["total_tokens"] == whole["usage"]["prompt_tokens"] + whole["usage"]["completion_tokens"]
        streamed = fold(stream_chat(srv.client, _body(name, extras)))
        assert (streamed["content"] or None, streamed["reasoning_content"] or None) == (content, reasoning)
        assert (calls_of(streamed), streamed["finish_reason"]) == (calls, finish)
        # Byte-identical arguments, streamed or whole (one serialisation).
        assert [c["arguments"] for c in streamed["calls"]] == [c["function"]["arguments"]
                                                              for c in message.get("tool_calls", [])]
        ids = [c["id"] for c in message.get("tool_calls", [])]
        assert len(set(ids)) == len(ids) and all(i.startswith("call_") for i in ids)


def test_prompt_format_follows_the_model():
    """V3.2 prompts end in the think token of the mode; V3.1 uses its template with a tools section."""
    server, prompts = _serve("DeepSeek-V3.2", V32, "ok")
    with server as srv:
        srv.client.post("/v1/chat/completions", json=_body("DeepSeek-V3.2", {"tools": [WEATHER]}))
        srv.client.post("/v1/chat/completions", json=_body("DeepSeek-V3.2", {"chat_template_kwargs": {"thinking": True}}))
    assert prompts[0].startswith("<｜begin▁of▁sentence｜>") and prompts[0].endswith("<｜Assistant｜></think>")
    assert "get_weather" in prompts[0] and "get_weather" not in prompts[1]
    assert prompts[1].endswith("<｜Assistant｜><think>")
    server, prompts = _serve("DeepSeek-V3.1", None, "ok")
    with server as srv:
        assert srv.state.tool_parser == "deepseekv31" and srv.state.reasoning_parser == "deepseek-v3"
        srv.client.post("/v1/chat/completions", json=_body("DeepSeek-V3.1", {"tools": [WEATHER]}))
    assert "## Tools" in prompts[0] and "get_weather" in prompts[0]


def test_history_with_tool_calls_and_results_is_encoded():
    server, prompts = _serve("DeepSeek-V3.2", V32, "It is sunny.")
    history = [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"location": "Paris"}'}}
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny, 21C"}]},
    ]
    with server as srv:
        r = srv.client.post("/v1/chat/completions", json={"model": "DeepSeek-V3.2", "messages": history,
                                                          "tools": [WEATHER]})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "It is sunny."
    assert 'name="location" string="true">Paris<' in prompts[0] and "sunny, 21C" in prompts[0]


def test_tool_choice_none_hides_tools_and_keeps_markup_as_text():
    completion = f"{FC}\n{I('get_weather')}\n{IE}\n{FCE}"
    server, prompts = _serve("DeepSeek-V3.2", V32, completion)
    with server as srv:
        r = srv.client.post("/v1/chat/completions", json=_body("DeepSeek-V3.2", {"tools": [WEATHER], "tool_choice": "none"}))
        message = r.json()["choices"][0]["message"]
    assert "get_weather" not in prompts[0]
    assert message["content"] == completion and "tool_calls" not in message


def test_named_tool_choice_shows_only_that_tool():
    server, prompts = _serve("DeepSeek-V3.2", V32, "ok")
    choice = {"type": "function", "function": {"name": "get_datetime"}}
    with server as srv:
        r = srv.client.post("/v1/chat/completions",
                            json=_body("DeepSeek-V3.2", {"tools": [WEATHER, TIME], "tool_choice": choice}))
        assert r.status_code == 200
    assert "get_datetime" in prompts[0] and "get_weather" not in prompts[0]


def test_reasoning_field_alias():
    server, _ = _serve("DeepSeek-V3.2", V32, "why</think>because", reasoning_field_alias=True)
    body = _body("DeepSeek-V3.2", {"chat_template_kwargs": {"thinking": True}})
    with server as srv:
        message = srv.client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        assert message["reasoning_content"] == message["reasoning"] == "why"
        events = stream_chat(srv.client, body)
    alias = "".join(e["choices"][0]["delta"].get("reasoning", "") for e in events[:-1] if e["choices"])
    assert alias == "why"


@pytest.mark.parametrize("stream", [False, True])
def test_malformed_arguments_kept_verbatim_and_counted(stream):
    completion = f"{CALLS_BEGIN}{CALL_BEGIN}f{SEP}{{bad json{CALL_END}{CALL_BEGIN}g{SEP}[\"a\"]{CALL_END}{CALLS_END}"
    server, _ = _serve("DeepSeek-V3.1", None, completion)
    with server as srv:
        body = _body("DeepSeek-V3.1", {"tools": [WEATHER]})
        if stream:
            message = fold(stream_chat(srv.client, body))
            calls = [(c["name"], c["arguments"]) for c in message["calls"]]
        else:
            message = srv.client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
            calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
        assert calls == [("f", "{bad json"), ("g", '["a"]')]
        assert srv.metric("dsa:tool_call_parse_errors_total") == 2
    for _, arguments in calls:
        with pytest.raises(json.JSONDecodeError if arguments.startswith("{") else AssertionError):
            assert isinstance(json.loads(arguments), dict)


def test_n_choices_stream_interleaved_each_with_its_own_role_and_finish():
    server, _ = _serve("DeepSeek-V3.2", V32, "abc def")
    with server as srv:
        events = stream_chat(srv.client, {**_body("DeepSeek-V3.2", {}), "n": 3})
        whole = srv.client.post("/v1/chat/completions", json={**_body("DeepSeek-V3.2", {}), "n": 3}).json()
    assert [c["message"]["content"] for c in whole["choices"]] == ["abc def"] * 3
    per_choice: dict[int, list] = {}
    for e in events[:-1]:
        choice = e["choices"][0]
        per_choice.setdefault(choice["index"], []).append(choice)
    assert sorted(per_choice) == [0, 1, 2]
    for chunks in per_choice.values():
        assert chunks[0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(c["delta"].get("content", "") for c in chunks) == "abc def"
        assert [c["finish_reason"] for c in chunks if c["finish_reason"]] == ["stop"]


def test_completions_echo_logprobs_and_stop():
    server, _ = _serve("DeepSeek-V3.2", V32, "one two three four")
    with server as srv:
        body = {"model": "DeepSeek-V3.2", "prompt": "Count:", "max_tokens": 50, "echo": True, "logprobs": 2,
                "stop": [" three"]}
        whole = srv.client.post("/v1/completions", json=body).json()["choices"][0]
        assert (whole["text"], whole["finish_reason"]) == ("Count:one two", "stop")
        lp = whole["logprobs"]
        # Logprobs cover every generated token, the stop string's included (as the engine reports them).
        assert lp["tokens"] == list("one two three") and len(lp["top_logprobs"][0]) == 2
        assert lp["text_offset"][:2] == [len("Count:"), len("Count:") + 1]
        with srv.client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            from tests.server.live import sse_events

            events = list(sse_events(r))
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "Count:one two"
    assert [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"][0]["finish_reason"]] == ["stop"]
