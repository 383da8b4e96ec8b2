"""Client mistakes get an OpenAI error object, never a 500 or a wrong 200.

Each test sends the mistake as a client would, checks the status and the error object, then checks that
an ordinary request right after is answered as usual and promptly.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.server.needs import server_extra

server_extra()

from dsa_runtime.engine import SamplingParams  # noqa: E402
from dsa_runtime.server.errors import APIError  # noqa: E402
from dsa_runtime.server.json_body import MAX_DEPTH, decode_json  # noqa: E402
from tests.server.live import LiveServer, assert_error, post_raw, start_serve  # noqa: E402
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


# -- nesting -------------------------------------------------------------------------------------------------
def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _chat(**fields: str) -> str:
    """A chat body as JSON text (no model name: any server takes it), with ``fields`` spliced in as raw JSON."""
    parts = ['"max_tokens": 4', *(f'"{k}": {v}' for k, v in fields.items())]
    if "messages" not in fields:
        parts.append('"messages": [{"role": "user", "content": "hi"}]')
    return "{" + ", ".join(parts) + "}"


def _tools(parameters: str) -> str:
    return '[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": ' \
           '{"a": ' + parameters + "}}}}]"


def _call_history(arguments: str) -> str:
    return ('[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", '
            '"type": "function", "function": {"name": "f", "arguments": ' + arguments + '}}]}, '
            '{"role": "tool", "tool_call_id": "c1", "content": "ok"}]')


DEEP = _nested(10_000)
DEEP_CASES = {
    "whole-body": ("/v1/chat/completions", DEEP),
    "message-content": ("/v1/chat/completions", _chat(messages='[{"role": "user", "content": ' + DEEP + "}]")),
    "tool-parameters": ("/v1/chat/completions", _chat(tools=_tools(DEEP))),
    "tool-call-arguments": ("/v1/chat/completions", _chat(messages=_call_history('{"x": ' + DEEP + "}"))),
    "completions-prompt": ("/v1/completions", '{"prompt": ' + DEEP + "}"),
    "tokenize-messages": ("/tokenize", '{"messages": [{"role": "user", "content": ' + DEEP + "}]}"),
}


@pytest.mark.parametrize("case", sorted(DEEP_CASES))
def test_json_nested_10000_levels_is_a_400(srv, case):
    """Used to be 500 ``internal error: RecursionError`` from json.loads."""
    path, text = DEEP_CASES[case]
    err = assert_error(post_raw(srv.client, path, text), 400)
    assert err["type"] == "invalid_request_error" and f"nested more than {MAX_DEPTH} levels" in err["message"]
    still_serving(srv)


def test_nesting_just_past_the_limit_names_the_field(srv):
    """Shallow enough for json.loads, too deep for the limit: the top-level field is named."""
    text = _chat(tools=_tools(_nested(MAX_DEPTH)))
    err = assert_error(post_raw(srv.client, "/v1/chat/completions", text), 400, param="tools")
    assert f"nested more than {MAX_DEPTH} levels" in err["message"]
    still_serving(srv)


@pytest.mark.parametrize("server", ["srv", "real_server"])  # V3's Jinja template, V3.2's encoder
@pytest.mark.parametrize("where", ["tool-parameters", "tool-call-arguments"])
def test_nesting_near_the_limit_renders_into_the_prompt(request, server, where):
    """A value just under the limit passes every later stage (schema and arguments rendered as JSON text)."""
    objects = '{"a": ' * 110 + "1" + "}" * 110  # dicts, as real schemas and arguments are
    text = _chat(tools=_tools(objects)) if where == "tool-parameters" else _chat(messages=_call_history(objects))
    assert text.count("{") + text.count("[") <= MAX_DEPTH  # a bound on the depth: it is within the limit
    live = request.getfixturevalue(server)
    r = post_raw(live.client, "/v1/chat/completions", text)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("depth", [MAX_DEPTH, MAX_DEPTH + 1, 990, 10_000, 1_000_000])
def test_decode_json_depth_limit(depth):
    text = _nested(depth).encode()
    if depth <= MAX_DEPTH:
        assert decode_json(text) is not None
    else:
        with pytest.raises(APIError) as info:
            decode_json(text)
        assert info.value.status == 400


# -- lone surrogates -----------------------------------------------------------------------------------------
LONE = '"hi \\ud800 there"'  # the JSON text of a string holding a lone high surrogate
SURROGATE_CASES = {
    "chat-content": ("/v1/chat/completions", _chat(messages='[{"role": "user", "content": ' + LONE + "}]"),
                     "messages.0.content"),
    "chat-content-part": (
        "/v1/chat/completions",
        _chat(messages='[{"role": "user", "content": [{"type": "text", "text": "hi \\udc00"}]}]'),
        "messages.0.content.0.text",
    ),
    "tool-call-arguments": ("/v1/chat/completions", _chat(messages=_call_history(LONE)),
                            "messages.1.tool_calls.0.function.arguments"),
    "tool-description": (
        "/v1/chat/completions",
        _chat(tools='[{"type": "function", "function": {"name": "f", "description": ' + LONE + "}}]"),
        "tools.0.function.description",
    ),
    "tool-parameter-key": ("/v1/chat/completions", _chat(tools=_tools('{"\\ud800x": 1}')),
                           "tools.0.function.parameters.properties.a"),
    "model-name": ("/v1/chat/completions", _chat(model=LONE), "model"),
    "completions-prompt": ("/v1/completions", '{"prompt": ' + LONE + "}", "prompt"),
    "completions-prompt-list": ("/v1/completions", '{"prompt": ["ok", ' + LONE + "]}", "prompt.1"),
    "tokenize-prompt": ("/tokenize", '{"prompt": ' + LONE + "}", "prompt"),
    "tokenize-messages": ("/tokenize", '{"messages": [{"role": "user", "content": ' + LONE + "}]}",
                          "messages.0.content"),
}


@pytest.mark.parametrize("case", sorted(SURROGATE_CASES))
def test_lone_surrogate_is_a_400_naming_the_field(srv, case):
    """Used to be a 500 TypeError from the tokenizer (or a failure encoding the reply)."""
    path, text, param = SURROGATE_CASES[case]
    err = assert_error(post_raw(srv.client, path, text), 400, param=param)
    assert "lone UTF-16 surrogate" in err["message"] and f"'{param}'" in err["message"]
    still_serving(srv)


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16-le"])
def test_a_raw_lone_surrogate_is_a_400_too(srv, encoding):
    """Not escaped but encoded (json.loads decodes bytes with "surrogatepass", and takes UTF-16 bodies)."""
    text = '{"messages": [{"role": "user", "content": "hi \ud800 there"}]}'
    r = srv.client.post("/v1/chat/completions", content=text.encode(encoding, "surrogatepass"),
                        headers={"content-type": "application/json"})
    assert_error(r, 400, param="messages.0.content")
    still_serving(srv)


def test_surrogate_pairs_are_ordinary_text(srv):
    """An escaped astral character (what ``json.dumps`` sends for an emoji) is fine: only lone halves are not."""
    text = _chat(messages='[{"role": "user", "content": "hi \\ud83d\\ude00"}]')
    r = post_raw(srv.client, "/v1/chat/completions", text)
    assert r.status_code == 200, r.text
    tokens = post_raw(srv.client, "/tokenize", '{"prompt": "\\ud83d\\ude00"}').json()["tokens"]
    assert srv.client.post("/detokenize", json={"tokens": tokens}).json()["prompt"] == "\U0001F600"


def test_a_recursion_error_from_a_later_stage_is_a_400(srv, monkeypatch):
    """The backstop: should some body shape get past the limit and recurse too deeply later, it is still a 400."""
    def too_deep(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(srv.state.prompts, "render", too_deep)
    err = assert_error(srv.client.post("/v1/chat/completions", json=OK_BODY), 400)
    assert "nested too deeply" in err["message"]
    monkeypatch.undo()
    still_serving(srv)


# -- structured output ---------------------------------------------------------------------------------------
COMPLETION = {"model": MODEL, "prompt": "hi", "max_tokens": 2}


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize(("fmt", "param"), [
    ({"type": "regex"}, "response_format.type"),
    ({}, "response_format.type"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "minProperties": "two"}}},
     "response_format"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}, "response_format"),
])
def test_malformed_or_invalid_response_format_is_a_400_naming_the_field(srv, route, fmt, param):
    pytest.importorskip("xgrammar")
    body = OK_BODY if route == "/v1/chat/completions" else COMPLETION
    assert_error(srv.client.post(route, json={**body, "response_format": fmt}), 400, param=param)
    still_serving(srv)


@pytest.mark.parametrize(("field", "value"), [
    ("guided_json", "{not json"), ("guided_json", 3), ("guided_regex", "(unclosed"), ("guided_regex", ""),
    ("guided_choice", []), ("guided_choice", ["a", 2]), ("guided_grammar", "root ::= "),
    ("structured_outputs", {"json": {"type": "object"}, "regex": "a"}), ("structured_outputs", "json"),
])
def test_bad_vllm_structured_output_extras_are_a_400(srv, field, value):
    pytest.importorskip("xgrammar")
    assert_error(srv.client.post("/v1/chat/completions", json={**OK_BODY, field: value}), 400, param=field)
    assert srv.client.post("/v1/chat/completions", json={**OK_BODY, field: None}).status_code == 200
    still_serving(srv)


def test_two_constraints_at_once_are_a_400(srv):
    pytest.importorskip("xgrammar")
    body = {**OK_BODY, "response_format": {"type": "json_object"}, "guided_regex": "a+"}
    assert_error(srv.client.post("/v1/chat/completions", json=body), 400, param="guided_regex")


def test_response_format_text_is_the_default_and_accepted(srv):
    r = srv.client.post("/v1/chat/completions", json={**OK_BODY, "response_format": {"type": "text"}})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Hell"
    r = srv.client.post("/v1/completions", json={**COMPLETION, "response_format": {"type": "text"}})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "He"
    r = srv.client.post("/v1/chat/completions", json={**OK_BODY, "response_format": None})
    assert r.status_code == 200


def test_response_format_of_the_wrong_type_names_the_field(srv):
    assert_error(srv.client.post("/v1/chat/completions", json={**OK_BODY, "response_format": "json"}), 400,
                 param="response_format")


# -- a multi-megabyte prompt ---------------------------------------------------------------------------------
BIG_TEXT = "hello world " * (7_000_000 // 12)  # 7 MB, under the 8 MiB body limit: ~2.9M tokens of the tiny model
HEALTH_BOUND_S = 1.0  # was 6-8 s (the whole tokenization); now milliseconds, with room for a loaded 2-core CI
BIG_CASES = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": BIG_TEXT}], "max_tokens": 4}, 400),
    "completions": ("/v1/completions", {"prompt": BIG_TEXT, "max_tokens": 4}, 400),
    "tokenize": ("/tokenize", {"prompt": BIG_TEXT}, 200),
}


@pytest.fixture(scope="module")
def tiny_serve():
    """``serve()`` on the embedded model in a subprocess: a server that shared this process's GIL could stall
    this test's own clock along with its event loop, and hide the stall."""
    proc, url = start_serve("from dsa_runtime.engine import Engine; engine = Engine.from_model(None, dtype='float32')",
                            served_model_name="tiny")
    try:
        with httpx.Client(base_url=url, timeout=120) as client:
            yield client
    finally:
        proc.terminate()
        proc.wait(60)


@pytest.mark.parametrize("case", sorted(BIG_CASES))
def test_a_multi_megabyte_prompt_does_not_stall_other_clients(tiny_serve, case):
    """Tokenizing 7 MB used to run on the event loop holding the GIL: /health waited 6-8 s behind it."""
    path, body, status = BIG_CASES[case]
    result: dict = {}

    def big() -> None:
        start = time.monotonic()
        with httpx.Client(base_url=str(tiny_serve.base_url), timeout=120) as client:
            result["response"] = client.post(path, json=body)
        result["elapsed"] = time.monotonic() - start

    sender = threading.Thread(target=big)
    sender.start()
    waits = []
    while sender.is_alive():
        start = time.monotonic()
        assert tiny_serve.get("/health").status_code == 200
        waits.append(time.monotonic() - start)
        time.sleep(0.01)
    sender.join()
    r = result["response"]
    assert r.status_code == status, r.text[:300]
    if status == 400:  # the big prompt gets its ordinary answer: it does not fit the tiny model's context
        err = r.json()["error"]
        assert err["code"] == "context_length_exceeded" and err["param"] == ("messages" if case == "chat" else "prompt")
    else:
        assert r.json()["count"] > 1_000_000
    assert len(waits) >= 3, "the big request ended before /health could be probed during it"
    assert max(waits) < min(HEALTH_BOUND_S, result["elapsed"] / 4), (max(waits), result["elapsed"])
    start = time.monotonic()
    ok = tiny_serve.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                       "max_tokens": 4})
    assert ok.status_code == 200 and time.monotonic() - start < PROMPT_OK_S, ok.text


TEXTS = ["", "hello world", "<｜begin▁of▁sentence｜>hi<｜User｜>x<｜Assistant｜></think>", "中文 ½ \U0001F600 \n\t",
         "a" * 5000, "x<｜end▁of▁sentence｜>y", "  leading", "trailing  \n"]


def test_prompt_encoding_off_the_gil_gives_the_tokenizers_ids():
    """PromptBuilder.encode uses the GIL-releasing batch call; the ids are those of Tokenizer.encode."""
    from dsa_runtime.loader.default_model import embedded_model_path
    from dsa_runtime.loader.tokenizer import load_tokenizer
    from dsa_runtime.server.config import FLAVORS
    from dsa_runtime.server.prompting import PromptBuilder

    tokenizer = load_tokenizer(embedded_model_path())
    prompts = PromptBuilder(FLAVORS["v3.2"], tokenizer)
    for text in TEXTS:
        assert prompts.encode(text) == tokenizer.encode(text), text
    with pytest.raises(APIError) as info:
        prompts.encode("hello " * 100, max_len=50, param="prompt")
    assert info.value.code == "context_length_exceeded" and info.value.param == "prompt"
    assert prompts.encode("hello", max_len=50) == tokenizer.encode("hello")


def test_an_integer_of_5000_digits_is_a_400(srv):
    """json.loads refuses it with a plain ValueError (not a JSONDecodeError), which used to escape as a 500."""
    err = assert_error(post_raw(srv.client, "/v1/chat/completions", _chat(seed="1" * 5000)), 400)
    assert "not valid JSON" in err["message"]
    still_serving(srv)


def test_after_a_500_the_next_request_on_the_same_connection_succeeds(srv, monkeypatch):
    """uvicorn drops the connection after an unhandled error; ``Connection: close`` tells the client so, instead
    of its next request meeting a reset on the dead keep-alive connection."""
    def broken(*args, **kwargs):
        raise RuntimeError("a server bug")

    monkeypatch.setattr(srv.state.prompts, "render", broken)
    r = srv.client.post("/v1/chat/completions", json=OK_BODY)
    assert_error(r, 500, None, "internal_error")
    assert r.headers["connection"] == "close"
    monkeypatch.undo()
    still_serving(srv)  # same httpx.Client: it used to reuse the dropped connection and fail with ReadError
