"""Overlap scheduling (step N launched before step N-1's tokens reach the host) gives exactly the outputs of the
synchronous engine: the same tokens, text, finish reasons and logprobs, with stop strings, stop ids, EOS,
max_tokens, max_model_len, seeded sampling, aborts mid-stream and preemption. On a CPU the device runs
synchronously, so the engine enables overlap only on CUDA; these tests force it on to check the bookkeeping
(in-flight tokens read from the device, dropped rows of finished requests, pages and slots returned)."""

from __future__ import annotations

import pytest

from dsa_runtime.engine import Engine, EngineConfig, SamplingParams
from tests.engine.helpers import random_prompts, run_all


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every test here runs on one torch thread (tests/conftest.py)."""


def _engine(overlap: bool, **fields) -> Engine:
    engine = Engine(EngineConfig(max_running_requests=8, **fields))
    engine._overlap = overlap
    return engine


def _params(i: int) -> SamplingParams:
    kinds = [
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.9, seed=i, max_tokens=20, top_p=0.9, logprobs=2),
        SamplingParams(temperature=0, max_tokens=30, stop=[" ", "e"]),  # a stop string ends it early
        SamplingParams(temperature=0.7, seed=100 + i, max_tokens=25, top_k=20, stop_token_ids=[7, 11, 13]),
        SamplingParams(temperature=0, max_tokens=1),
    ]
    return kinds[i % len(kinds)]


def _summary(outs: dict[str, list]) -> dict[str, tuple]:
    result = {}
    for rid, seq in outs.items():
        last = seq[-1]
        text = "".join(o.new_text for o in seq)
        ids = [t for o in seq for t in o.new_token_ids]
        lps = [(lp.token_id, round(lp.logprob, 5)) for o in seq for lp in o.logprobs]
        result[rid] = (tuple(last.token_ids), tuple(ids), text, last.finish_reason, last.stop_reason, tuple(lps))
    return result


def _run(overlap: bool, prompts: list[list[int]], abort_at: dict[int, str] | None = None, params=_params,
         **fields):
    engine = _engine(overlap, **fields)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params(i))
    seen: dict[str, list] = {}
    steps = 0
    while engine.has_unfinished():
        for out in engine.step():
            seen.setdefault(out.request_id, []).append(out)
        steps += 1
        if abort_at and steps in abort_at:
            engine.abort(abort_at[steps])
        assert steps < 2000
    stats = engine.stats()
    assert stats.pages_used == 0 and stats.num_running == 0
    assert engine.slots.num_free == engine.slots.max_requests
    assert engine._inflight is None
    return _summary(seen), engine


def test_overlap_gives_the_synchronous_outputs():
    prompts = random_prompts(10, seed=3, lo=2, hi=30, vocab=3000)
    sync, _ = _run(False, prompts)
    over, engine = _run(True, prompts)
    assert over == sync
    assert engine.stats().steps_total > 0


def test_overlap_with_aborts_mid_stream():
    prompts = random_prompts(8, seed=4, lo=2, hi=20, vocab=3000)
    aborts = {5: "r1", 9: "r3", 10: "r6"}
    sync, _ = _run(False, prompts, aborts)
    over, _ = _run(True, prompts, aborts)
    # An abort lands at a step boundary; under overlap the host has seen one step fewer, so an aborted request
    # may report one token less. Everything not aborted is identical.
    assert {k: v for k, v in over.items() if k not in aborts.values()} == {
        k: v for k, v in sync.items() if k not in aborts.values()}
    for rid in aborts.values():
        assert over[rid][3] == "abort" and sync[rid][3] == "abort"
        assert sync[rid][0][: len(over[rid][0])] == over[rid][0]


def test_overlap_under_preemption_and_max_model_len():
    prompts = random_prompts(8, seed=5, lo=20, hi=40, vocab=3000)
    fields = {"max_total_tokens": 256, "page_size": 16, "max_model_len": 60}

    def long(i: int) -> SamplingParams:  # every request runs into max_model_len: the cache cannot hold them all
        return SamplingParams(temperature=0.8 if i % 2 else 0, seed=i, max_tokens=100, ignore_eos=True)

    sync, _ = _run(False, prompts, params=long, **fields)
    over, engine = _run(True, prompts, params=long, **fields)
    assert over == sync
    assert engine.scheduler.num_preemptions > 0, "the small cache was meant to force preemptions"


def test_in_flight_tokens_are_read_on_the_device():
    """Under overlap a decode row's token is -1 in the host's step and the runner reads it from its slot state."""
    engine = _engine(True)
    engine.add_request("a", [5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    plans = []
    real = engine.runner.run
    engine.runner.run = lambda step: (plans.append(step.rows[1].tolist()), real(step))[1]
    run_all(engine)
    assert plans and any(-1 in row for row in plans)
