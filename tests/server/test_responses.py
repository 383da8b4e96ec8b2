"""``/v1/responses`` through the official ``openai`` client, on the embedded tiny-chat model (real engine).

The client's own ``openai.types.responses`` models are the spec: every whole answer and every streamed event
is validated against them strictly (pydantic ``model_validate`` of the raw JSON, not the client's lenient
construction), and the client's ``responses.stream`` helper must accumulate the stream without complaint.
"""

from __future__ import annotations

import json

import pytest

from tests.server.needs import server_extra

server_extra()
openai = pytest.importorskip("openai", reason="the client tests need: pip install -e '.[server,test]'")
from openai.types.responses import Response, ResponseStreamEvent  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

MODEL = "tiny"  # the real_server fixture's served name
WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
SUM = "What is 47 + 38?"
EVENTS = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def client(real_server):
    with openai.OpenAI(base_url=real_server.url + "/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def create(client, **kwargs) -> Response:
    """``client.responses.create``, with the raw JSON validated strictly against the client's Response model."""
    raw = client.responses.with_raw_response.create(model=MODEL, temperature=0, **kwargs)
    Response.model_validate(raw.http_response.json(), strict=False)
    return raw.parse()


def stream_events(real_server, **body) -> list:
    """The raw SSE of a streamed request: each ``event:`` name checked against its data, each data validated
    strictly as a ResponseStreamEvent; returns the typed events."""
    events = []
    with real_server.client.stream("POST", "/v1/responses", timeout=120,
                                   json={"model": MODEL, "temperature": 0, **body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: "):])
                assert data["type"] == name, (name, data)
                events.append(EVENTS.validate_python(data))
            else:
                assert line == "", line
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events


def tokens(real_server, messages, tools=None, thinking=False) -> int:
    """The prompt length of chat ``messages`` as ``/tokenize`` renders them."""
    body = {"messages": messages, "chat_template_kwargs": {"thinking": thinking}, **({"tools": tools} if tools else {})}
    return real_server.client.post("/tokenize", json=body).json()["count"]


def check_item_events(events) -> None:
    """Each output item's events nest properly and its deltas add up to the item ``output_item.done`` carries."""
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    added, done, texts = {}, {}, {}
    for e in events[2:-1]:
        if e.type == "response.output_item.added":
            assert e.output_index == len(added) and e.item.status == "in_progress"
            added[e.output_index] = e.item
            texts[e.output_index] = ""
        elif e.type == "response.output_item.done":
            assert added[e.output_index].id == e.item.id and e.output_index not in done
            done[e.output_index] = e.item
        elif e.type.endswith(".delta"):
            assert e.output_index in added and e.output_index not in done
            assert e.item_id == added[e.output_index].id
            texts[e.output_index] += e.delta
    assert set(added) == set(done)
    final = events[-1].response
    assert [i.id for i in final.output] == [done[k].id for k in sorted(done)]
    for k, item in done.items():
        if item.type == "function_call":
            assert texts[k] == item.arguments
        else:
            assert texts[k] == item.content[0].text


# ---------------------------------------------------------------------------------------------- text


def test_whole_text_answer(client, real_server):
    r = create(client, input="What is the capital of France?", max_output_tokens=60)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == MODEL
    assert r.status == "completed" and r.incomplete_details is None and r.error is None
    (item,) = r.output
    assert item.type == "message" and item.id.startswith("msg_") and item.status == "completed"
    assert item.role == "assistant" and item.content[0].type == "output_text"
    assert "Paris" in r.output_text and r.output_text == item.content[0].text
    u = r.usage
    assert u.input_tokens == tokens(real_server, [{"role": "user", "content": "What is the capital of France?"}])
    assert 0 < u.output_tokens < 60 and u.total_tokens == u.input_tokens + u.output_tokens
    assert u.output_tokens_details.reasoning_tokens == 0


def test_streamed_text_equals_whole(client, real_server):
    ask = {"input": "What is the capital of Japan?", "max_output_tokens": 60}
    whole = create(client, **ask)
    events = stream_events(real_server, **ask)
    check_item_events(events)
    assert events[-1].type == "response.completed"
    final = events[-1].response
    assert final.output_text == whole.output_text and final.usage == whole.usage
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == whole.output_text and len(deltas) > 1
    kinds = [e.type for e in events]
    assert kinds.index("response.output_text.done") < kinds.index("response.content_part.done") < kinds.index(
        "response.output_item.done")
    # the client's stream helper accumulates the same answer
    with client.responses.stream(model=MODEL, temperature=0, **ask) as s:
        assert s.get_final_response().output_text == whole.output_text


def test_instructions_are_the_system_prompt(client, real_server):
    instructions = "You are a helpful assistant."
    r = create(client, input="Hello!", instructions=instructions, max_output_tokens=40)
    expected = tokens(real_server, [{"role": "system", "content": instructions}, {"role": "user", "content": "Hello!"}])
    assert r.usage.input_tokens == expected
    assert r.instructions == instructions
    # a continuation does not carry them over (each request states its own)
    again = create(client, input="Hello again!", previous_response_id=r.id, max_output_tokens=40)
    history = [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": r.output_text},
               {"role": "user", "content": "Hello again!"}]
    assert again.usage.input_tokens == tokens(real_server, history)
    assert again.instructions is None and again.previous_response_id == r.id


# ---------------------------------------------------------------------------------------------- thinking


def test_thinking_on_gives_a_reasoning_item(client, real_server):
    r = create(client, input=SUM, reasoning={"effort": "high"}, max_output_tokens=200)
    reasoning, message = r.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_") and reasoning.status == "completed"
    assert reasoning.content[0].type == "reasoning_text" and "47" in reasoning.content[0].text
    assert message.type == "message" and "85" in r.output_text
    # the reasoning tokens are those up to and including </think>
    written = real_server.client.post("/tokenize", json={"prompt": reasoning.content[0].text + "</think>"})
    assert r.usage.output_tokens_details.reasoning_tokens == written.json()["count"] < r.usage.output_tokens
    assert r.reasoning.effort == "high"
    assert r.usage.input_tokens == tokens(real_server, [{"role": "user", "content": SUM}], thinking=True)

    events = stream_events(real_server, input=SUM, reasoning={"effort": "high"}, max_output_tokens=200)
    check_item_events(events)
    streamed = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert streamed == reasoning.content[0].text
    (done,) = [e for e in events if e.type == "response.reasoning_text.done"]
    assert done.text == streamed and done.item_id == events[-1].response.output[0].id
    assert events[-1].response.usage == r.usage


@pytest.mark.parametrize("reasoning", [None, {"effort": "none"}])
def test_thinking_off_has_no_reasoning_item(client, real_server, reasoning):
    extra = {"reasoning": reasoning} if reasoning else {}
    r = create(client, input=SUM, max_output_tokens=200, **extra)
    assert [item.type for item in r.output] == ["message"]
    assert r.output_text.startswith("47 + 38 = ") and r.usage.output_tokens_details.reasoning_tokens == 0
    # the prompt is the non-thinking one (it ends in </think>, one token fewer than <think> would not be)
    assert r.usage.input_tokens == tokens(real_server, [{"role": "user", "content": SUM}], thinking=False)


# ---------------------------------------------------------------------------------------------- tools


def test_tool_round_trip(client, real_server):
    ask = "What's the weather like in Paris?"
    r = create(client, input=ask, tools=[WEATHER], max_output_tokens=120)
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert r.output_text == "" and r.tools[0].name == "get_weather"
    assert r.usage.input_tokens == tokens(real_server, [{"role": "user", "content": ask}],
                                          [{"type": "function", "function": {k: v for k, v in WEATHER.items()
                                                                             if k != "type"}}])

    # stateless: the whole conversation sent back as items
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"}
    items = [{"role": "user", "content": ask}, call.model_dump(exclude_none=True), result]
    answer = create(client, input=items, tools=[WEATHER], max_output_tokens=120)
    assert [i.type for i in answer.output] == ["message"] and "18" in answer.output_text
    # stored: the same turn through previous_response_id renders the same prompt
    chained = create(client, input=[result], previous_response_id=r.id, tools=[WEATHER], max_output_tokens=120)
    assert chained.output_text == answer.output_text
    assert chained.usage.input_tokens == answer.usage.input_tokens
    assert chained.usage.input_tokens_details.cached_tokens > 0  # the first turn's prompt is a cached prefix


def test_tool_call_streamed(client, real_server):
    events = stream_events(real_server, input="What's the weather like in Paris?", tools=[WEATHER],
                           max_output_tokens=120)
    check_item_events(events)
    (added,) = [e for e in events if e.type == "response.output_item.added"]
    assert added.item.type == "function_call" and added.item.name == "get_weather" and added.item.arguments == ""
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(args) == {"city": "Paris"} and done.arguments == args
    final = events[-1].response.output[0]
    assert final.call_id == added.item.call_id and final.status == "completed"


def test_thinking_tool_round_trip_keeps_the_reasoning_item(client):
    ask = "What's the weather like in Paris?"
    r = create(client, input=ask, tools=[WEATHER], reasoning={"effort": "medium"}, max_output_tokens=200)
    call = r.output[-1]
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"}
    # the reasoning item goes back with the call (thinking mode needs it on the assistant turn)
    again = create(client, input=[result], previous_response_id=r.id, tools=[WEATHER],
                   reasoning={"effort": "medium"}, max_output_tokens=200)
    assert again.status == "completed" and again.output[-1].type == "message"


# ---------------------------------------------------------------------------------------------- structured


def test_json_schema_output_validates(client):
    pytest.importorskip("xgrammar", reason="structured output needs: pip install -e '.[structured]'")
    from typing import Literal

    from pydantic import BaseModel, Field

    class City(BaseModel):  # bounded, so the answer fits max_output_tokens whatever the model writes
        name: str = Field(max_length=12)
        continent: Literal["Europe", "Asia", "Africa", "America"]

    r = client.responses.parse(model=MODEL, input="Describe a city as JSON.", text_format=City, temperature=0,
                               max_output_tokens=200)
    assert r.status == "completed" and isinstance(r.output_parsed, City)
    assert City.model_validate_json(r.output_text) == r.output_parsed
    assert r.text.format.type == "json_schema" and r.text.format.name == "City"


# ---------------------------------------------------------------------------------------------- limits, usage


def test_max_output_tokens_cut_is_incomplete(client, real_server):
    r = create(client, input=SUM, reasoning={"effort": "high"}, max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.usage.output_tokens_details.reasoning_tokens == 3
    assert [i.type for i in r.output] == ["reasoning"] and r.output[0].status == "incomplete"
    events = stream_events(real_server, input=SUM, reasoning={"effort": "high"}, max_output_tokens=3)
    check_item_events(events)
    assert events[-1].type == "response.incomplete" and events[-1].response.incomplete_details.reason == (
        "max_output_tokens")


def test_cached_tokens_for_a_repeated_prefix(client):
    instructions = "You answer questions about countries. " * 20  # several KV pages of shared prefix
    first = create(client, input="What is the capital of Italy?", instructions=instructions, max_output_tokens=40)
    second = create(client, input="What is the capital of Spain?", instructions=instructions, max_output_tokens=40)
    a, b = first.usage, second.usage
    assert a.input_tokens == b.input_tokens > 100  # both questions are 8 tokens long
    assert 64 <= b.input_tokens_details.cached_tokens < b.input_tokens
    assert b.total_tokens == b.input_tokens + b.output_tokens


# ---------------------------------------------------------------------------------------------- store


def test_retrieve_and_delete_a_stored_response(client):
    r = create(client, input="Hello!", max_output_tokens=20)
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.usage == r.usage
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model=MODEL, input="Hi", previous_response_id=r.id)
    assert info.value.body["param"] == "previous_response_id"


def test_store_false_is_not_kept(client):
    r = create(client, input="Hello!", max_output_tokens=20, store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model=MODEL, input="Hi", previous_response_id=r.id)
    err = info.value.body
    assert err["param"] == "previous_response_id" and err["code"] == "previous_response_not_found"
    assert r.id in err["message"]


def test_unknown_previous_response_id_is_404(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model=MODEL, input="Hi", previous_response_id="resp_doesnotexist")
    assert info.value.status_code == 404 and info.value.body["param"] == "previous_response_id"

