"""The offline API over the toy runner: generate, stream, chat (V3.2 encoding + parsers) and score."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from dsa_runtime.engine import Engine, EngineConfig, SamplingParams
from dsa_runtime.engine.llm import LLM
from tests.engine.fakes import BYTE0, EOS, FakeTokenizer, hash_logits, make_parts

TOK = FakeTokenizer()


def _llm(logit_fn=None, **config) -> LLM:
    parts = make_parts(logit_fn=logit_fn, num_pages=1025)
    parts.model_config = SimpleNamespace(is_dsa=True, scale_fmt="ue8m0")
    return LLM(engine=Engine(EngineConfig(**config), parts=parts))


class Scripted:
    """Greedy script for one request at a time: the i-th sampled token is ``script[i]``."""

    def __init__(self, text: str) -> None:
        self.script = [BYTE0 + b for b in text.encode()] + [EOS]
        self.prompt_len: int | None = None

    def __call__(self, tokens: list[int]) -> torch.Tensor:
        logits = hash_logits(tokens, TOK.vocab_size)
        i = len(tokens) - (self.prompt_len or 0)
        logits[self.script[min(i, len(self.script) - 1)]] = 80.0
        return logits


def test_generate_accepts_every_prompt_shape_and_keeps_order():
    llm = _llm()
    greedy = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    one = llm.generate("Hello", greedy)
    assert len(one) == 1 and one[0].prompt_token_ids == TOK.encode("Hello", add_special_tokens=True)
    many = llm.generate(["Hello", "a longer prompt here", "x"], greedy)
    assert [o.prompt_token_ids[1:] for o in many] == [
        TOK.encode(t) for t in ("Hello", "a longer prompt here", "x")
    ]
    assert many[0].token_ids == one[0].token_ids
    ids = llm.generate([5, 6, 7], greedy)
    assert ids[0].prompt_token_ids == [5, 6, 7]
    lists = llm.generate([[5, 6, 7], [8]], [greedy, SamplingParams(temperature=0, max_tokens=2)])
    assert lists[0].token_ids == ids[0].token_ids and len(lists[1].token_ids) <= 2
    assert llm.engine.stats().pages_used == 0 and not llm.engine.has_unfinished()


@pytest.mark.parametrize("bad", [[], [1.5], [[1], "x", 3], None])
def test_generate_rejects_bad_prompts(bad):
    with pytest.raises(ValueError):
        _llm().generate(bad)


def test_stream_yields_deltas_and_abort_on_close():
    llm = _llm()
    outs = list(llm.stream([5, 6, 7], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)))
    assert outs[-1].finished and sum(len(o.new_token_ids) for o in outs) == 6
    it = llm.stream([5, 6, 7], SamplingParams(max_tokens=100, ignore_eos=True))
    next(it)
    assert llm.engine.stats().pages_used > 0
    it.close()
    assert llm.engine.stats().pages_used == 0 and not llm.engine.has_unfinished()


def test_chat_thinking_splits_reasoning_and_content():
    model = Scripted("I should greet.</think>Hi there!")
    llm = _llm(model)
    text, ids = llm.chat_prompt([{"role": "user", "content": "Hello"}], thinking=True)
    assert text.endswith("<｜Assistant｜><think>") and ids == TOK.encode(text)
    model.prompt_len = len(ids)
    result = llm.chat(
        [{"role": "user", "content": "Hello"}], thinking=True, sampling_params=SamplingParams(temperature=0)
    )
    assert result.reasoning_content == "I should greet."
    assert result.content == "Hi there!" and result.tool_calls == [] and result.finish_reason == "stop"


def test_chat_tool_call_is_parsed_from_dsml():
    from dsa_runtime.parsers.encoding_v32 import render_assistant_completion

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
             "properties": {"city": {"type": "string"}}}}}]  # fmt: skip
    call = {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}
    completion = render_assistant_completion(
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]}, "chat"
    )
    completion = completion.removesuffix("<｜end▁of▁sentence｜>")
    model = Scripted(completion)
    llm = _llm(model)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    _, ids = llm.chat_prompt(messages, tools=tools)
    model.prompt_len = len(ids)
    result = llm.chat(messages, tools=tools, sampling_params=SamplingParams(temperature=0, max_tokens=400))
    assert result.finish_reason == "tool_calls"
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]


def test_score_equals_the_runner_prefix_logits_and_frees_pages():
    llm = _llm(chunked_prefill_size=3)
    ids = [5, 9, 200, 17, 3, 44, 8]
    logits = llm.score(ids)
    assert logits.shape == (7, TOK.vocab_size) and logits.dtype == torch.float32
    for i in range(7):
        assert torch.equal(logits[i], hash_logits(ids[: i + 1], TOK.vocab_size))
    assert llm.engine.stats().pages_used == 0
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.score([5, 10**6])


@pytest.mark.parametrize(
    "is_dsa,scale_fmt,encoder,tool_parser",
    [
        (True, "ue8m0", "v32", "deepseekv32"),
        (False, "ue8m0", "jinja", "deepseekv31"),
        (False, "float", "jinja", "deepseekv3"),
    ],
)
def test_chat_format_per_model_family(is_dsa, scale_fmt, encoder, tool_parser):
    from dsa_runtime.engine.chat import chat_format, render_prompt

    fmt = chat_format(SimpleNamespace(is_dsa=is_dsa, scale_fmt=scale_fmt))
    assert (fmt.encoder, fmt.tool_parser) == (encoder, tool_parser)
    prompt = render_prompt(fmt, [{"role": "user", "content": "Hi"}])
    assert prompt.startswith("<｜begin▁of▁sentence｜>") and "<｜User｜>Hi<｜Assistant｜>" in prompt


WEATHER_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
                 {"type": "function", "function": {"name": "get_datetime", "parameters": {"type": "object"}}}]


def test_chat_named_tool_choice_forces_the_call_like_the_server():
    from dsa_runtime.parsers.tool_choice import forced_opening

    named = {"type": "function", "function": {"name": "get_weather"}}
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    model = Scripted('<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
                     "</｜DSML｜function_calls>")
    llm = _llm(model)
    text, ids = llm.chat_prompt(messages, WEATHER_TOOLS, thinking=True, tool_choice=named)
    opening = forced_opening("deepseekv32", "get_weather")
    # Thinking is off for a forced reply: the chat-mode generation prompt, then the opening; only that tool.
    assert text.endswith("<｜Assistant｜></think>" + opening) and ids == TOK.encode(text)
    assert "get_datetime" not in text
    model.prompt_len = len(ids)
    result = llm.chat(messages, WEATHER_TOOLS, thinking=True, tool_choice=named,
                      sampling_params=SamplingParams(temperature=0, max_tokens=400))
    assert (result.prompt, result.forced) == (text, opening) and not result.text.startswith(opening)
    assert result.finish_reason == "tool_calls" and result.reasoning_content is None and result.content is None
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert result.output is not None and len(result.output.prompt_token_ids) == len(ids)


def test_chat_tool_choice_none_shows_no_tools_and_keeps_markup_as_content():
    from dsa_runtime.parsers.tool_choice import ToolChoiceError

    markup = '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>'
    model = Scripted(markup)
    llm = _llm(model)
    messages = [{"role": "user", "content": "Hi"}]
    text, ids = llm.chat_prompt(messages, WEATHER_TOOLS, tool_choice="none")
    assert "get_weather" not in text
    model.prompt_len = len(ids)
    result = llm.chat(messages, WEATHER_TOOLS, tool_choice="none", sampling_params=SamplingParams(temperature=0))
    assert (result.content, result.tool_calls, result.finish_reason) == (markup, [], "stop")
    with pytest.raises(ToolChoiceError, match="not in 'tools'"):
        llm.chat(messages, WEATHER_TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
