"""``/v1/responses`` on a scripted engine: parallel calls and their outputs' order, a call cut by the token
limit, the bounded store, and every client mistake as a 400 / 404 naming its field."""

from __future__ import annotations

import json
import re
import types

import pytest

from tests.server.needs import server_extra

server_extra()

from tests.server.live import LiveServer, assert_error  # noqa: E402
from tests.server.scripted_engine import ScriptedEngine  # noqa: E402

MODEL = "DeepSeek-V3.2"
D = "｜DSML｜"
EOS = "<｜end▁of▁sentence｜>"
FC, FCE, IE, PE = f"<{D}function_calls>", f"</{D}function_calls>", f"</{D}invoke>", f"</{D}parameter>"
WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object",
                                                                     "properties": {"city": {"type": "string"}}}}


def call(city: str) -> str:
    return f'<{D}invoke name="get_weather">\n<{D}parameter name="city" string="true">{city}{PE}\n{IE}\n'


SCRIPTS = {
    "two-calls": f"\n\n{FC}\n{call('Paris')}{call('Rome')}{FCE}{EOS}",
    "think-call": f"The user wants weather.</think>\n\n{FC}\n{call('Oslo')}{FCE}{EOS}",
    "long-call": f"\n\n{FC}\n{call('Llanfairpwllgwyngyllgogerychwyrndrobwllllantysiliogogogoch')}{FCE}{EOS}",
}


def script(prompt: str) -> str:
    turn = prompt.rsplit("<｜User｜>", 1)[-1]  # the last user turn (the tools' system prompt shows the markup too)
    if "EXPLODE" in turn:
        raise ValueError("the scripted engine refuses this prompt")
    if "<function_results>" in turn:  # say which results the turn holds, in its order
        return ",".join(re.findall(r"<result>(.*?)</result>", turn)) + EOS
    for key, completion in SCRIPTS.items():
        if f"[[{key}]]" in turn:
            return completion
    return "Hello there." + EOS


def serve(**config) -> LiveServer:
    engine = ScriptedEngine(script)
    engine.model_config = types.SimpleNamespace(is_dsa=True)  # V3.2: DSML calls, thinking via </think>
    return LiveServer(engine, served_model_name=MODEL, **config)


@pytest.fixture(scope="module")
def srv():
    with serve() as server:
        yield server


def post(srv, **body):
    return srv.client.post("/v1/responses", json={"model": MODEL, **body})


def ok(srv, **body) -> dict:
    r = post(srv, **body)
    assert r.status_code == 200, r.text
    return r.json()


def streamed(srv, **body) -> list[dict]:
    events = []
    with srv.client.stream("POST", "/v1/responses", json={"model": MODEL, **body, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: "):]))
    return events


def test_parallel_calls_and_their_outputs_in_call_order(srv):
    r = ok(srv, input="[[two-calls]]", tools=[WEATHER])
    assert [(i["type"], i["status"], json.loads(i["arguments"])) for i in r["output"]] == [
        ("function_call", "completed", {"city": "Paris"}), ("function_call", "completed", {"city": "Rome"})]
    paris, rome = r["output"]
    assert paris["call_id"] != rome["call_id"] and paris["id"] != rome["id"]
    events = streamed(srv, input="[[two-calls]]", tools=[WEATHER])
    final = events[-1]["response"]["output"]
    assert [(i["name"], i["arguments"]) for i in final] == [(i["name"], i["arguments"]) for i in r["output"]]
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] == [0, 1]
    # outputs sent in the opposite order reach the prompt in the calls' order (V3.2 pairs them by position)
    outputs = [{"type": "function_call_output", "call_id": rome["call_id"], "output": "rain in Rome"},
               {"type": "function_call_output", "call_id": paris["call_id"], "output": "sun in Paris"}]
    answer = ok(srv, input=outputs, previous_response_id=r["id"], tools=[WEATHER])
    assert answer["output"][0]["content"][0]["text"] == "sun in Paris,rain in Rome"


def test_reasoning_then_call(srv):
    r = ok(srv, input="[[think-call]]", tools=[WEATHER], reasoning={"effort": "low"})
    assert [i["type"] for i in r["output"]] == ["reasoning", "function_call"]
    assert r["output"][0]["content"] == [{"type": "reasoning_text", "text": "The user wants weather."}]
    # the character tokenizer has no </think> token: an output that ends the reasoning counts whole
    assert 0 < r["usage"]["output_tokens_details"]["reasoning_tokens"] <= r["usage"]["output_tokens"]


def test_call_cut_by_the_token_limit_is_incomplete(srv):
    for body in (ok(srv, input="[[long-call]]", tools=[WEATHER], max_output_tokens=60),
                 streamed(srv, input="[[long-call]]", tools=[WEATHER], max_output_tokens=60)[-1]["response"]):
        assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
        (item,) = body["output"]
        assert item["type"] == "function_call" and item["status"] == "incomplete"
        assert body["usage"]["output_tokens"] == 60
    # the cut call never ran: a continuation leaves it out and needs no output for it
    cut = ok(srv, input="[[long-call]]", tools=[WEATHER], max_output_tokens=60)
    again = ok(srv, input="Hello?", previous_response_id=cut["id"], tools=[WEATHER])
    assert again["output"][0]["content"][0]["text"] == "Hello there."
    answering = {"type": "function_call_output", "call_id": cut["output"][0]["call_id"], "output": "x"}
    assert_error(post(srv, input=[answering], previous_response_id=cut["id"]), 400, "input.0.call_id")


def test_include_encrypted_reasoning_is_accepted(srv):
    r = ok(srv, input="hi", include=["reasoning.encrypted_content"], service_tier="auto", truncation="disabled")
    assert r["status"] == "completed"


@pytest.mark.parametrize(("body", "param"), [
    ({"background": True}, "background"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"truncation": "auto"}, "truncation"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"tools": [{"type": "function", "parameters": {}}]}, "tools.0.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "web_search"}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": [{"type": "image_generation_call", "id": "x"}]}, "input.0.type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input.0.content.0.type"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input.0.content.0.text"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input.0.role"),
    ({"input": ["hi"]}, "input"),
    ({"input": 5}, "input"),
    ({"input": []}, "input"),
    ({"input": [{"type": "function_call_output", "call_id": "call_x", "output": "x"}]}, "input.0.call_id"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input.0.call_id"),
    ({"input": [{"role": "user", "content": "x"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]}, "input"),
    ({"input": [{"role": "user", "content": "x"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": 7}]}, "input.2.output"),
    ({"reasoning": {"effort": "ultra"}}, "reasoning.effort"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"temperature": "0.5"}, "temperature"),
    ({"instructions": ["x"]}, "instructions"),
])
def test_client_mistakes_name_the_field(srv, body, param):
    err = assert_error(post(srv, **{"input": "hi", **body}), 400, param)
    assert err["type"] == "invalid_request_error"


def test_too_many_output_tokens_names_max_output_tokens(srv):
    err = assert_error(post(srv, input="hi", max_output_tokens=10**6), 400, "max_output_tokens",
                       "context_length_exceeded")
    assert "max_output_tokens" in err["message"] and "max_tokens" not in err["message"].replace("max_output", "")


def test_invalid_json_schema_names_text_format(srv):
    pytest.importorskip("xgrammar")
    r = post(srv, input="hi", text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("text.format")


def test_prompt_beyond_the_context_names_input(srv):
    assert_error(post(srv, input="x" * 5000), 400, "input", "context_length_exceeded")


def test_failure_after_the_stream_started_ends_it_with_error_events(srv):
    assert_error(post(srv, input="EXPLODE"), 400)
    events = streamed(srv, input="EXPLODE")
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "error", "response.failed"]
    assert "refuses" in events[2]["message"] and events[3]["response"]["status"] == "failed"
    assert events[3]["response"]["error"]["code"] == "invalid_prompt"  # the engine refused it: a 400
    assert [e["sequence_number"] for e in events] == [0, 1, 2, 3]
    assert ok(srv, input="hi")["status"] == "completed"  # and the server goes on


def test_unknown_model_and_unknown_stored_response(srv):
    assert_error(post(srv, input="hi", model="gpt-9"), 404, "model", "model_not_found")
    assert_error(srv.client.get("/v1/responses/resp_nope"), 404, None, "response_not_found")
    assert_error(srv.client.delete("/v1/responses/resp_nope"), 404, None, "response_not_found")
    assert_error(post(srv, input="hi", previous_response_id="resp_nope"), 404, "previous_response_id",
                 "previous_response_not_found")


def test_store_keeps_the_most_recently_used():
    with serve(responses_store_size=2) as server:
        a, b = ok(server, input="a")["id"], ok(server, input="b")["id"]
        assert server.client.get(f"/v1/responses/{a}").status_code == 200  # a is now the most recently used
        c = ok(server, input="c")["id"]
        err = assert_error(post(server, input="x", previous_response_id=b), 404, "previous_response_id",
                           "previous_response_not_found")
        assert b in err["message"] and "--responses-store-size" in err["message"]
        for kept in (a, c):
            assert server.client.get(f"/v1/responses/{kept}").json()["id"] == kept
        assert len(server.state.responses) == 2
        d = ok(server, input="x", previous_response_id=c)  # stored too: a, the least recently used, goes
        assert d["previous_response_id"] == c
        assert server.client.get(f"/v1/responses/{a}").status_code == 404


def test_store_size_zero_keeps_nothing():
    with serve(responses_store_size=0) as server:
        r = ok(server, input="a")
        assert_error(post(server, input="x", previous_response_id=r["id"]), 404, "previous_response_id",
                     "previous_response_not_found")
