"""MTP speculative decoding (``--speculative-algorithm EAGLE``) through the engine, fp32 on the CPU.

Greedy output with speculation equals greedy output without, token for token: on the embedded tiny-chat model
(its trained NextN layer drafts well, so most tokens come from accepted drafts) and on a random tiny-v32
checkpoint with a random NextN layer (drafts are rejected, so the verify's first row and the draft extend
carry everything). Sampled output keeps the target's distribution (a chi-squared test on the tokens drawn at
verify rows). Stop strings, stop tokens and max_tokens landing inside an accepted run, aborts, preemption,
logprobs, several tokens per streamed chunk and the flags' checks are covered too.
"""

from __future__ import annotations

import random

import pytest
import torch

from dsa_runtime.engine import Engine, EngineConfig, SamplingParams
from dsa_runtime.errors import ConfigError
from tests.engine.helpers import run_all

CHATS = ["What is 47 + 38?", "Hello!", "What is the capital of France?", "Convert 5 km to meters.",
         "What is 12 * 9?", "What is 305 - 17?", "Hi, who are you?", "Convert 3 kg to grams."]
# p = 0.001 critical values of the chi-squared distribution by degrees of freedom.
CHI2_CRITICAL = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def plain() -> Engine:
    return Engine(EngineConfig(dtype="float32"))


@pytest.fixture(scope="module")
def spec() -> Engine:
    return Engine(EngineConfig(dtype="float32", speculative_algorithm="EAGLE"))


def _chat(engine: Engine, text: str) -> list[int]:
    return engine.tokenizer.encode(f"<｜User｜>{text}<｜Assistant｜><think>")


def _final(engine: Engine, prompts: list[list[int]], params: list[SamplingParams]) -> dict[str, object]:
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"q{i}", p, sp)
    return {rid: outs[-1] for rid, outs in run_all(engine).items()}


def test_greedy_equals_plain_decode_on_the_embedded_model(plain, spec):
    prompts = [_chat(plain, c) for c in CHATS]
    params = [SamplingParams(temperature=0, max_tokens=120)] * len(prompts)
    before = spec.stats()
    a = _final(plain, prompts, params)
    b = _final(spec, prompts, params)
    for rid in a:
        assert b[rid].token_ids == a[rid].token_ids, rid
        assert (b[rid].text, b[rid].finish_reason) == (a[rid].text, a[rid].finish_reason)
    after = spec.stats()
    verifies = after.spec_verifies_total - before.spec_verifies_total
    emitted = after.spec_emitted_tokens_total - before.spec_emitted_tokens_total
    assert verifies > 0 and emitted / verifies >= 2.5  # the trained NextN layer: most drafts are accepted
    assert after.spec_accepted_tokens_total <= after.spec_draft_tokens_total
    assert after.steps_total - before.steps_total < plain.stats().steps_total  # fewer steps for the same tokens


@pytest.mark.parametrize("num_steps", [1, 2, 4])
def test_greedy_equals_plain_decode_on_a_random_tiny_v32_with_a_random_nextn_layer(tmp_path, num_steps):
    from dsa_runtime.loader.make_checkpoint import make_checkpoint

    path = make_checkpoint(tmp_path / "tiny-v32", "tiny-v32", seed=0)
    rng = random.Random(0)
    # below, at and above the chunk budget and index_topk (32); 8 tokens each (longer greedy runs of a random
    # model meet near-ties that batch shape alone flips, with or without speculation)
    prompts = [[rng.randrange(3, 1000) for _ in range(n)] for n in (3, 9, 17, 24, 31, 40, 52, 5)]
    params = [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)] * len(prompts)
    cfg = {"model": str(path), "dtype": "float32", "chunked_prefill_size": 16}
    a = _final(Engine(EngineConfig(**cfg)), prompts, params)
    engine = Engine(EngineConfig(**cfg, speculative_algorithm="EAGLE", speculative_num_steps=num_steps))
    b = _final(engine, prompts, params)
    assert {k: v.token_ids for k, v in b.items()} == {k: v.token_ids for k, v in a.items()}
    assert engine.stats().spec_draft_tokens_total > 0


def test_sampled_tokens_at_verify_rows_follow_the_target_distribution(spec):
    """Temperature 3, top-k 4: the third output token is drawn at a verify's second row when the first draft
    was accepted and at the next verify's first row otherwise; over 400 seeds its distribution given the most
    common first two tokens matches the target's (fp32 scoring of the same prefix), chi-squared p > 0.001."""
    prompt = _chat(spec, "What is 47 + 38?")
    n = 400
    params = [SamplingParams(temperature=3.0, top_k=4, max_tokens=3, seed=s, ignore_eos=True) for s in range(n)]
    before = spec.stats()
    outs = _final(spec, [prompt] * n, params)
    after = spec.stats()
    assert after.spec_accepted_tokens_total > before.spec_accepted_tokens_total  # some came from accepted drafts
    seqs = [tuple(o.token_ids) for o in outs.values()]
    heads: dict[tuple[int, int], list[int]] = {}
    for s in seqs:
        heads.setdefault(s[:2], []).append(s[2])
    head, thirds = max(heads.items(), key=lambda kv: len(kv[1]))
    assert len(thirds) >= 60
    logits = spec.score(prompt + list(head))[-1].double() / 3.0
    top = torch.topk(logits, 4)
    probs = torch.softmax(top.values, -1)
    expected = {int(t): float(p) * len(thirds) for t, p in zip(top.indices, probs, strict=True)}
    assert set(thirds) <= set(expected)
    big = [t for t, e in expected.items() if e >= 5]
    observed = [sum(1 for t in thirds if t == tok) for tok in big]
    exp = [expected[t] for t in big]
    rest_obs, rest_exp = len(thirds) - sum(observed), len(thirds) - sum(exp)
    if rest_exp >= 1:
        observed.append(rest_obs)
        exp.append(rest_exp)
    chi2 = sum((o - e) ** 2 / e for o, e in zip(observed, exp, strict=True))
    assert len(exp) >= 2
    assert chi2 < CHI2_CRITICAL[len(exp) - 1], (observed, exp)


def test_seeded_sampling_draws_the_same_tokens_as_plain_decoding(plain, spec):
    """Each output token uses the random number of its index, so a seeded request matches plain decoding."""
    prompts = [_chat(plain, c) for c in CHATS[:4]]
    params = [SamplingParams(temperature=0.8, top_p=0.9, max_tokens=60, seed=7 + i) for i in range(4)]
    a = _final(plain, prompts, params)
    b = _final(spec, prompts, params)
    assert {k: v.token_ids for k, v in b.items()} == {k: v.token_ids for k, v in a.items()}


def test_max_tokens_stop_strings_and_stop_ids_inside_an_accepted_run(plain, spec):
    prompt = _chat(plain, "What is 47 + 38?")
    full = _final(plain, [prompt], [SamplingParams(temperature=0, max_tokens=60)])["q0"]
    text = full.text
    stop = text[len(text) // 2: len(text) // 2 + 3]
    cases = [SamplingParams(temperature=0, max_tokens=m) for m in (1, 2, 3, 5, 6, 7)]
    cases += [SamplingParams(temperature=0, max_tokens=60, stop=[stop]),
              SamplingParams(temperature=0, max_tokens=60, stop=[stop], include_stop_str_in_output=True),
              SamplingParams(temperature=0, max_tokens=60, stop_token_ids=[full.token_ids[9]])]
    a = _final(plain, [prompt] * len(cases), cases)
    b = _final(spec, [prompt] * len(cases), cases)
    for rid in a:
        assert (b[rid].token_ids, b[rid].text, b[rid].finish_reason, b[rid].stop_reason) == (
            a[rid].token_ids, a[rid].text, a[rid].finish_reason, a[rid].stop_reason), rid
    assert [len(b[f"q{i}"].token_ids) for i in range(6)] == [1, 2, 3, 5, 6, 7]


def test_streamed_chunks_carry_several_tokens_and_add_up(spec):
    spec.add_request("s", _chat(spec, "Convert 5 km to meters."), SamplingParams(temperature=0, max_tokens=80))
    outs = run_all(spec)["s"]
    assert max(len(o.new_token_ids) for o in outs) > 1
    assert [t for o in outs for t in o.new_token_ids] == outs[-1].token_ids
    assert "".join(o.new_text for o in outs) == outs[-1].text


def test_logprobs_of_every_accepted_token(plain, spec):
    prompt = _chat(plain, "What is 12 * 9?")
    params = SamplingParams(temperature=0, max_tokens=40, logprobs=2)
    got = {}
    for name, engine in (("plain", plain), ("spec", spec)):
        engine.add_request("l", prompt, params)
        chunks = run_all(engine)["l"]
        got[name] = (chunks[-1].token_ids, [lp for o in chunks for lp in o.logprobs])
    ids, logprobs = got["spec"]
    assert ids == got["plain"][0]
    assert [lp.token_id for lp in logprobs] == ids
    for mine, ref in zip(logprobs, got["plain"][1], strict=True):
        assert mine.logprob == pytest.approx(ref.logprob, abs=1e-4)
        assert [t for t, _ in mine.top] == [t for t, _ in ref.top]


def test_abort_inside_a_run_frees_everything_and_others_finish_unchanged(plain, spec):
    prompts = [_chat(plain, c) for c in CHATS[:3]]
    params = [SamplingParams(temperature=0, max_tokens=50)] * 3
    a = _final(plain, prompts, params)
    for i, p in enumerate(prompts):
        spec.add_request(f"q{i}", p, params[i])
    seen: dict[str, list] = {}
    for step in range(200):
        if not spec.has_unfinished():
            break
        if step == 3:
            spec.abort("q1")
        for o in spec.step():
            seen.setdefault(o.request_id, []).append(o)
    assert seen["q1"][-1].finish_reason == "abort"
    for rid in ("q0", "q2"):
        assert seen[rid][-1].token_ids == a[rid].token_ids
    assert spec.stats().pages_used == 0


def test_preemption_under_speculation_recomputes_and_matches(plain):
    prompts = [_chat(plain, c) for c in CHATS]
    params = [SamplingParams(temperature=0, max_tokens=60)] * len(prompts)
    a = _final(plain, prompts, params)
    small = Engine(EngineConfig(dtype="float32", speculative_algorithm="EAGLE", max_total_tokens=128,
                                page_size=16, max_model_len=120))
    b = _final(small, prompts, params)
    assert small.stats().num_preemptions > 0
    assert {k: v.token_ids for k, v in b.items()} == {k: v.token_ids for k, v in a.items()}


def test_structured_requests_verify_without_drafts_beside_speculating_ones(spec):
    pytest.importorskip("xgrammar")
    from dsa_runtime.engine.structured import StructuredOutput

    spec.add_request("free", _chat(spec, "What is 47 + 38?"), SamplingParams(temperature=0, max_tokens=40))
    spec.add_request("json", spec.tokenizer.encode("<｜User｜>Reply in JSON.<｜Assistant｜></think>"),
                     SamplingParams(temperature=1.0, seed=3, max_tokens=200,
                                    structured=StructuredOutput.json_schema({"type": "object", "properties": {
                                        "a": {"type": "integer"}}, "required": ["a"]})))
    outs = run_all(spec)
    import json

    assert isinstance(json.loads(outs["json"][-1].text)["a"], int)
    assert outs["free"][-1].finish_reason == "stop"


@pytest.mark.parametrize("kwargs, message", [
    ({"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 2}, "only 1"),
    ({"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_num_draft_tokens": 6},
     r"must be --speculative-num-steps \+ 1"),
    ({"speculative_num_steps": 2}, "needs --speculative-algorithm"),
    ({"speculative_algorithm": "MEDUSA"}, "must be one of"),
])
def test_flags_are_checked(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        EngineConfig(**kwargs)


def test_nextn_alias_and_defaults():
    cfg = EngineConfig(speculative_algorithm="nextn")
    assert (cfg.speculative_algorithm, cfg.speculative_num_steps, cfg.speculative_eagle_topk,
            cfg.speculative_num_draft_tokens) == ("EAGLE", 3, 1, 4)
    assert EngineConfig().speculative is False


def test_a_checkpoint_without_an_mtp_layer_is_a_clear_error(tmp_path):
    from dsa_runtime.engine.build import build_parts_from_weights
    from dsa_runtime.loader import load_checkpoint
    from dsa_runtime.loader.make_checkpoint import make_checkpoint

    ck = load_checkpoint(make_checkpoint(tmp_path / "v32", "tiny-v32", seed=0))
    assert ck.mtp_tensors
    with pytest.raises(ConfigError, match="needs the checkpoint's MTP"):
        build_parts_from_weights(EngineConfig(speculative_algorithm="EAGLE"), ck.config, dict(ck.tensors),
                                 ck.tokenizer)
