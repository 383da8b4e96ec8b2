"""Prefill chunks as token rows of the decode batch (the CUDA-graph path of a step that admits requests): each
chunk token is a row at its position in its request's slot, so a step that mixes prefills and decodes is one
decode-shaped forward. On a CPU there are no graphs, so the engine takes that path only when told how many rows
a graph would take; here it is forced on. Each row is what a decode of that token computes, so the reference is
the eager engine fed one prompt token per step (``chunked_prefill_size`` 1: every token through the absorbed
decode attention); float32 weights, the cache in bf16 as always."""

from __future__ import annotations

import pytest

from dsa_runtime.engine import Engine, EngineConfig, SamplingParams
from tests.engine.helpers import random_prompts


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every test here runs on one torch thread (tests/conftest.py)."""


def _run(graph_rows: int, prompts, arrivals, **fields):
    engine = Engine(EngineConfig(max_running_requests=8, dtype="float32", **fields))
    engine.runner.graph_rows = graph_rows  # steps of at most this many rows run as decode rows (no graphs on CPU)
    widths = []
    run = engine.runner.run
    engine.runner.run = lambda step: (widths.append(step.num_rows), run(step))[1]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=2)
    tokens: dict[str, list] = {}
    steps = 0
    pending = list(enumerate(prompts))
    while pending or engine.has_unfinished():
        while pending and arrivals(steps, pending[0][0]):
            i, p = pending.pop(0)
            engine.add_request(f"r{i}", p, params)
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(
                (lp.token_id, lp.top[0][1] - lp.top[1][1]) for lp in out.logprobs)
        steps += 1
    assert engine.stats().pages_used == 0 and engine.slots.num_free == engine.slots.max_requests
    return tokens, widths


def _agree_but_at_near_ties(got, want):
    """Greedy tokens agree until, at most, a position where the reference's top-2 logits are within 0.05 (rows
    batched differently round differently)."""
    assert got.keys() == want.keys()
    for rid, ours in got.items():
        theirs = want[rid]
        assert len(ours) == len(theirs)
        split = next((k for k, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a[0] != b[0]), None)
        if split is not None:
            print(f"{rid}: diverges at token {split}, eager top-2 gap {theirs[split][1]:.4f}")
            assert theirs[split][1] < 0.05, f"{rid} diverges at token {split} where the eager gap is {theirs[split][1]}"


@pytest.mark.parametrize("chunk", [512, 16])
def test_prefill_rows_give_the_eager_tokens(chunk):
    prompts = random_prompts(6, seed=5, lo=3, hi=40)
    def staggered(step, i):  # requests arrive while others decode: steps mix prefill rows and decode rows
        return step >= 3 * i
    want, eager_widths = _run(0, prompts, staggered, chunked_prefill_size=1)
    got, widths = _run(64, prompts, staggered, chunked_prefill_size=chunk)
    _agree_but_at_near_ties(got, want)
    assert max(eager_widths) <= 8  # eager: the decode batch holds one row per request
    assert max(widths) > 8, "no step put a prefill chunk's tokens into the decode rows"


def test_a_prompt_longer_than_the_largest_graph_takes_the_eager_prefill():
    prompts = random_prompts(3, seed=9, lo=30, hi=40)
    want, _ = _run(0, prompts, lambda step, i: True, chunked_prefill_size=1)
    got, widths = _run(24, prompts, lambda step, i: True)  # 3 prompts of 30+ tokens exceed 24 rows
    _agree_but_at_near_ties(got, want)
    assert widths[0] > 24 and max(widths[1:]) <= 24  # the prompts in one eager step, then decode rows


def test_rows_past_the_largest_graph_are_packed_into_several_replays():
    prompts = random_prompts(5, seed=4, lo=10, hi=20)
    want, _ = _run(0, prompts, lambda step, i: True, chunked_prefill_size=1)
    got, widths = _run(24, prompts, lambda step, i: True)  # 5 prompts of 10-20 tokens: 3+ replays of <= 24 rows
    _agree_but_at_near_ties(got, want)
    assert max(widths) <= 24 and sum(w > 8 for w in widths) >= 3
