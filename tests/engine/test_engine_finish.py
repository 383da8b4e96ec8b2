"""Stop strings, stop tokens, EOS, lengths, streaming text and logprobs through the engine."""

from __future__ import annotations

import pytest

from dsa_runtime.engine import EngineConfig, SamplingParams
from tests.engine.fakes import BYTE0, EOS, PAD, FakeTokenizer, scripted
from tests.engine.helpers import make_engine, run_all

TOK = FakeTokenizer()
PROMPT = TOK.encode("Hello")


def _run(script: list[int], params: SamplingParams, prompt=PROMPT, **kw):
    engine = make_engine(kw.pop("config", None), logit_fn=scripted(script, len(prompt), TOK.vocab_size), **kw)
    engine.add_request("a", prompt, params)
    outs = run_all(engine)["a"]
    assert engine.stats().pages_used == 0
    return outs


def _bytes(text: str) -> list[int]:
    return [BYTE0 + b for b in text.encode()]


@pytest.mark.parametrize("byte_tokenizer", [False, True])
def test_stop_string_across_token_boundaries_is_not_emitted(byte_tokenizer):
    script = _bytes("abc ST") + _bytes("OP tail") + [EOS]
    outs = _run(
        script, SamplingParams(temperature=0, stop=["STOP"], max_tokens=50), byte_tokenizer=byte_tokenizer
    )
    last = outs[-1]
    assert last.finished and last.finish_reason == "stop" and last.stop_reason == "STOP"
    assert last.text == "abc " == "".join(o.new_text for o in outs)
    # the stream never showed a prefix of the stop string
    assert all("S" not in o.new_text for o in outs)
    assert last.token_ids == script[: len(_bytes("abc STOP"))]


def test_include_stop_str_in_output():
    script = _bytes("x STOP y")
    outs = _run(script, SamplingParams(temperature=0, stop=["STOP"], include_stop_str_in_output=True))
    assert outs[-1].text == "x STOP" and outs[-1].stop_reason == "STOP"


def test_held_back_prefix_is_released_when_it_does_not_become_a_stop():
    script = _bytes("ST then STAR") + [EOS]
    outs = _run(script, SamplingParams(temperature=0, stop=["STOP"]))
    assert (
        outs[-1].text == "ST then STAR" and outs[-1].finish_reason == "stop" and outs[-1].stop_reason is None
    )
    assert "".join(o.new_text for o in outs) == "ST then STAR"


def test_stop_token_id_ends_without_its_text_unless_asked():
    script = _bytes("ab") + [BYTE0 + ord("Z")] + _bytes("cd")
    z = BYTE0 + ord("Z")
    outs = _run(script, SamplingParams(temperature=0, stop_token_ids=[z]))
    assert outs[-1].text == "ab" and outs[-1].stop_reason == z and outs[-1].token_ids[-1] == z
    outs = _run(script, SamplingParams(temperature=0, stop_token_ids=[z], include_stop_str_in_output=True))
    assert outs[-1].text == "abZ"


def test_eos_stops_unless_ignored():
    script = _bytes("hi") + [EOS] + _bytes("more")
    outs = _run(script, SamplingParams(temperature=0))
    assert outs[-1].finish_reason == "stop" and outs[-1].stop_reason is None and outs[-1].text == "hi"
    assert outs[-1].token_ids == script[:3]
    outs = _run(script, SamplingParams(temperature=0, ignore_eos=True, max_tokens=7))
    assert outs[-1].finish_reason == "length" and outs[-1].token_ids == script[:7]
    assert outs[-1].text == "himore"  # EOS is a special token: skipped in the text


def test_special_tokens_kept_when_not_skipped():
    script = _bytes("a") + [PAD] + _bytes("b")
    outs = _run(script, SamplingParams(temperature=0, max_tokens=3, skip_special_tokens=False))
    assert outs[-1].text == "a<pad>b"


def test_max_tokens_and_max_model_len():
    script = _bytes("0123456789abcdef")
    outs = _run(script, SamplingParams(temperature=0, max_tokens=4))
    assert outs[-1].finish_reason == "length" and len(outs[-1].token_ids) == 4 and len(outs) == 4
    outs = _run(script, SamplingParams(temperature=0, max_tokens=100), config=EngineConfig(max_model_len=9))
    assert outs[-1].finish_reason == "length" and len(PROMPT) + len(outs[-1].token_ids) == 9


@pytest.mark.parametrize("byte_tokenizer", [False, True])
def test_multibyte_output_streams_whole_characters(byte_tokenizer):
    text = "日本語🙂é"
    outs = _run(_bytes(text) + [EOS], SamplingParams(temperature=0), byte_tokenizer=byte_tokenizer)
    assert outs[-1].text == text
    assert all("\ufffd" not in o.new_text for o in outs)
    assert any(o.new_text == "" and o.new_token_ids for o in outs)  # bytes were held back


def test_logprobs_per_step_match_tokens():
    script = _bytes("abcdef")
    outs = _run(script, SamplingParams(temperature=0, logprobs=2, max_tokens=6))
    lps = [lp for o in outs for lp in o.logprobs]
    assert [lp.token_id for lp in lps] == script
    assert all(len(lp.top) == 2 and lp.top[0][0] == lp.token_id for lp in lps)
    assert all(lp.logprob <= 0 for lp in lps)


def test_metrics_are_ordered():
    m = _run(_bytes("abc"), SamplingParams(temperature=0, max_tokens=3))[-1].metrics
    assert m.arrival <= m.scheduled <= m.first_token <= m.last_token <= m.finished


@pytest.mark.parametrize(
    "prompt,match",
    [
        ([], "empty"),
        ([5, 10_000], "outside the vocabulary"),
        ([-1], "outside"),
        (list(range(3, 40)), "max_model_len"),
    ],
)
def test_bad_requests_are_refused_with_a_message(prompt, match):
    engine = make_engine(EngineConfig(max_model_len=30))
    with pytest.raises(ValueError, match=match):
        engine.add_request("a", prompt, SamplingParams())
    assert not engine.has_unfinished()


def test_duplicate_live_id_and_bad_params_refused():
    engine = make_engine()
    engine.add_request("a", [5, 6], SamplingParams())
    with pytest.raises(ValueError, match="already running"):
        engine.add_request("a", [5, 6], SamplingParams())
    with pytest.raises(ValueError, match="SamplingParams"):
        engine.add_request("b", [5, 6], {"max_tokens": 3})


def test_max_model_len_is_capped_by_cache_capacity():
    engine = make_engine(EngineConfig(max_model_len=10_000), num_pages=11, page_size=4)
    assert engine.max_model_len == 40 and engine.stats().pages_total == 10


def test_close_stops_the_runner_after_the_last_request():
    engine = make_engine()
    engine.add_request("r", [BYTE0 + 1, BYTE0 + 2], SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(run_all(engine)["r"]) > 0
    assert not engine.runner.stopped
    engine.close()
    assert engine.runner.stopped
