"""The official ``openai`` Python client against the live server on the embedded model (real engine)."""

from __future__ import annotations

import pytest

from tests.server.needs import server_extra

server_extra()
openai = pytest.importorskip("openai", reason="the client tests need: pip install -e '.[server,test]'")

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def client(real_server):
    with openai.OpenAI(base_url=real_server.url + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def test_models_list(client, real_server):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert models.data[0].object == "model"


def test_chat_non_streaming(client):
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello!"}], max_tokens=8, temperature=0,
        extra_body={"ignore_eos": True},
    )
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.model == "tiny" and r.id.startswith("chatcmpl-")
    assert choice.finish_reason == "length" and choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert r.usage.completion_tokens == 8 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 8


def test_chat_streaming_with_usage_chunk(client):
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello!"}], max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    whole = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello!"}], max_tokens=6, temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert text == whole.choices[0].message.content


def test_tools_are_passed_through_to_the_prompt(client, real_server):
    """The tools reach the V3.2 prompt (counted by /tokenize), and a tools request answers normally."""
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    plain = real_server.client.post("/tokenize", json={"messages": messages}).json()["count"]
    with_tools = real_server.client.post("/tokenize", json={"messages": messages, "tools": [WEATHER]}).json()
    assert with_tools["count"] > plain + 20
    r = client.chat.completions.create(
        model="tiny", messages=messages, tools=[WEATHER], tool_choice="auto", max_tokens=8, temperature=0,
    )
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r.usage.prompt_tokens == with_tools["count"]


def test_named_tool_choice_returns_that_call_to_the_client(client, real_server):
    """A forced call reaches the official client as a tool call, whole and streamed (random weights: the
    arguments are anything; a stop on a quarter of the vocabulary ends generation well before max_tokens)."""
    import random

    messages = [{"role": "user", "content": "Weather in Paris?"}]
    vocab = real_server.state.tokenizer.vocab_size
    extra = {"stop_token_ids": random.Random(3).sample(range(vocab), vocab // 4)}
    choice = {"type": "function", "function": {"name": "get_weather"}}
    kwargs = {"model": "tiny", "messages": messages, "tools": [WEATHER], "tool_choice": choice, "max_tokens": 64,
              "temperature": 1.0, "seed": 5, "extra_body": extra}
    r = client.chat.completions.create(**kwargs)
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.tool_calls[0].function.name == (
        "get_weather")
    # The forced opening is prompt: more prompt tokens than the same messages and tools without it.
    counted = real_server.client.post("/tokenize", json={"messages": messages, "tools": [WEATHER]}).json()["count"]
    assert r.usage.prompt_tokens > counted
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    headers = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or []) if tc.id]
    assert [h.function.name for h in headers] == [c.function.name for c in r.choices[0].message.tool_calls]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_reasoning_content_in_thinking_mode(client):
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Think first."}], max_tokens=8, temperature=0,
        extra_body={"chat_template_kwargs": {"thinking": True}, "ignore_eos": True},
    )
    message = r.choices[0].message
    # The prompt ends in <think>, so what the model writes first is reasoning (the tiny model never closes it).
    assert isinstance(message.reasoning_content, str) and message.reasoning_content
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Think first."}], max_tokens=8, temperature=0,
        stream=True, extra_body={"chat_template_kwargs": {"thinking": True}, "ignore_eos": True},
    )
    streamed = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in stream if c.choices)
    assert streamed == message.reasoning_content


def test_completions(client):
    r = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=5, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5 and r.choices[0].text
    pieces = list(client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=5, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True}))
    assert "".join(p.choices[0].text for p in pieces) == r.choices[0].text


def test_logprobs(client):
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0, logprobs=True,
        top_logprobs=3, extra_body={"ignore_eos": True},
    )
    content = r.choices[0].logprobs.content
    assert len(content) == 4
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        assert item.top_logprobs[0].logprob >= item.top_logprobs[-1].logprob
        # Greedy: the chosen token is the most likely one.
        assert item.logprob == pytest.approx(item.top_logprobs[0].logprob)


def test_n_choices_and_seed(client):
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=6, n=3, seed=11, temperature=1.0,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in r.choices] == [0, 1, 2] and r.usage.completion_tokens == 18
    again = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=6, n=3, seed=11, temperature=1.0,
        extra_body={"ignore_eos": True},
    )
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]


def test_errors_surface_as_openai_exceptions(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], n=50)
    assert info.value.body["param"] == "n"
