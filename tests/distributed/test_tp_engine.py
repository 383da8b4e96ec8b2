"""--tp through the engine: LLM(tp=2), DP attention layouts and the distributed runner at tp 1 generate the same
greedy tokens as LLM() for a batch of mixed-length prompts, with the prefix cache, structured output, MTP,
aborts and preemption; a step reaches the workers as tensors only; layouts that cannot split are one-line
errors."""

from __future__ import annotations

import pytest

from dsa_runtime.errors import ConfigError

# Prompt + 8 tokens stay within index_topk (32): past it the FP8 indexer can flip a near-tied key between
# TP degrees (see test_tp_equivalence), which greedy decoding of a random tiny model then amplifies.
PROMPTS = ["Hello there", "The quick brown fox jumps", "1 2 3"]


@pytest.fixture(scope="module")
def greedy_tp1():
    from dsa_runtime import LLM
    from dsa_runtime.engine import SamplingParams

    # gloo on the CPU: a GPU host must not send these ranks to its (possibly single) GPU
    return [o.token_ids for o in LLM(dtype="float32", device="cpu").generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0))]


@pytest.mark.parametrize("layout", [{"tp": 2}, {"tp": 2, "dp": 2, "enable_dp_attention": True},
                                    {"tp": 4, "dp": 2, "enable_dp_attention": True},
                                    {"distributed_executor_backend": "mp"}])
def test_llm_tp_generates_the_tp1_tokens(greedy_tp1, layout):
    from dsa_runtime import LLM
    from dsa_runtime.engine import SamplingParams

    llm = LLM(dtype="float32", device="cpu", **layout)
    try:
        out = llm.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0))
        assert [o.token_ids for o in out] == greedy_tp1
    finally:
        llm.engine.close()


def test_layouts_that_cannot_split_are_clear_errors(capsys):
    from dsa_runtime.cli.main import main
    from dsa_runtime.engine.config import EngineConfig

    with pytest.raises(ConfigError, match="needs --enable-dp-attention"):
        EngineConfig(tp=2, dp=2)
    with pytest.raises(ConfigError, match="must be a multiple of --dp"):
        EngineConfig(tp=3, dp=2, enable_dp_attention=True)
    with pytest.raises(ConfigError, match="need --dist-init-addr"):
        EngineConfig(tp=4, nnodes=2)
    assert main(["generate", "--tp", "3", "--prompt", "hi", "--max-tokens", "1"]) != 0
    assert "4 attention heads do not split over 3 ranks" in capsys.readouterr().err


def test_tp_on_too_few_gpus_is_a_clear_error(monkeypatch, tmp_path):
    import types

    import torch

    from dsa_runtime.distributed.engine_build import _spec
    from dsa_runtime.engine.config import EngineConfig

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    kernels = types.SimpleNamespace(device="cuda")
    with pytest.raises(ConfigError, match=r"--tp 2 needs 2 GPUs on this node .* torch sees 1"):
        _spec(EngineConfig(tp=2), tmp_path, kernels, num_pages=8, page_size=64, hidden=256, max_context=512)


@pytest.mark.parametrize("layout", [{"tp": 2}, {"tp": 2, "dp": 2, "enable_dp_attention": True},
                                    {"tp": 4, "dp": 2, "enable_dp_attention": True}])
def test_tp_with_the_prefix_cache_generates_the_uncached_tp1_tokens(layout):
    """Under TP every rank reads the cached pages' rows (rank 0's tree hands out page ids, each rank holds its
    heads' rows at those ids; under DP attention a prefix's first page keeps its requests in one group): a second
    wave sharing a 4-page prefix hits and decodes the tp 1 tokens."""
    import random

    from dsa_runtime import LLM
    from dsa_runtime.engine import SamplingParams

    rng = random.Random(5)
    prefix = [rng.randrange(3, 3000) for _ in range(16)]
    waves = [[prefix + [7, 8]], [prefix + [9], prefix + [10, 11, 12]]]
    params = SamplingParams(max_tokens=6, temperature=0)
    plain = LLM(dtype="float32", device="cpu", page_size=4, disable_radix_cache=True)
    want = [[o.token_ids for o in plain.generate(w, params)] for w in waves]
    llm = LLM(dtype="float32", device="cpu", page_size=4, **layout)
    try:
        got = [llm.generate(w, params) for w in waves]
        assert [[o.token_ids for o in w] for w in got] == want
        assert [o.num_cached_tokens for o in got[1]] == [16, 16]
        stats = llm.engine.stats()
        assert stats.pages_used == 0 and stats.pages_cached == llm.engine.prefix_cache.num_nodes > 0
    finally:
        llm.engine.close()


@pytest.mark.parametrize("layout", [{"tp": 2}, {"tp": 2, "dp": 2, "enable_dp_attention": True},
                                    {"tp": 4, "dp": 2, "enable_dp_attention": True}])
def test_speculative_decoding_under_tp_generates_the_tp1_tokens(layout):
    """MTP under --tp 2 and under DP attention (tp 4, dp 2): every rank holds its slice of the NextN layer and
    a draft cache layer, each attention group runs its requests' verify and draft rows; the embedded model's
    greedy output equals plain tp 1 decoding, and most drafts are accepted."""
    from dsa_runtime import LLM
    from dsa_runtime.engine import SamplingParams

    prompts = ["<｜User｜>What is 47 + 38?<｜Assistant｜><think>", "<｜User｜>Hello!<｜Assistant｜><think>",
               "<｜User｜>Convert 5 km to meters.<｜Assistant｜><think>"]
    params = SamplingParams(max_tokens=40, temperature=0)
    want = [o.token_ids for o in LLM(dtype="float32", device="cpu").generate(prompts, params)]
    llm = LLM(dtype="float32", device="cpu", speculative_algorithm="EAGLE", **layout)
    try:
        assert [o.token_ids for o in llm.generate(prompts, params)] == want
        assert llm.engine.stats().spec_accept_length >= 2.5
    finally:
        llm.engine.close()


def _refuse_objects(monkeypatch):
    """Rank 0 may not send a pickled object from here on (the steps' collectives are tensors only)."""
    import torch.distributed as dist

    def refuse(*args, **kwargs):
        raise AssertionError("a step sent per-sequence Python objects to the workers")

    for name in ("gather_object", "broadcast_object_list", "send_object_list", "scatter_object_list",
                 "all_gather_object"):
        monkeypatch.setattr(dist, name, refuse)


@pytest.mark.parametrize("layout", [{"tp": 2}, {"tp": 2, "dp": 2, "enable_dp_attention": True},
                                    {"tp": 4, "dp": 2, "enable_dp_attention": True}])
def test_steps_send_tensors_and_aborts_preemption_and_grammars_match_tp1(monkeypatch, layout):
    """A small cache (preemptions), an abort mid-decode and a JSON-schema request at tp 2 (and DP attention):
    the tp 1 tokens, no pickled object sent by any step, and zero pages and slots held at the end."""
    from dsa_runtime.engine import Engine, EngineConfig, SamplingParams
    from dsa_runtime.engine.structured import StructuredOutput

    prompts = [[5 + i, 17, 29 + i, 41, 53, 67 + i, 71, 83] for i in range(5)]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}

    def run(**fields) -> tuple[dict, Engine]:
        engine = Engine(EngineConfig(dtype="float32", device="cpu", page_size=4, max_total_tokens=96, **fields))
        if fields:
            _refuse_objects(monkeypatch)
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", p, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
        engine.add_request("json", prompts[0], SamplingParams(max_tokens=24, temperature=0,
                                                              structured=StructuredOutput.json_schema(schema)))
        got: dict[str, list[int]] = {}
        steps = 0
        while engine.has_unfinished():
            for out in engine.step():
                got[out.request_id] = out.token_ids
            steps += 1
            if steps == 6:
                engine.abort("r3")
        return got, engine

    want, _ = run()
    got, engine = run(**layout)
    try:
        assert got == want
        stats = engine.stats()
        assert stats.num_preemptions > 0, "the small cache was meant to preempt"
        assert stats.pages_used == 0 and engine.slots.num_free == engine.slots.max_requests
    finally:
        monkeypatch.undo()
        runner = engine.runner
        engine.close()
        assert runner.closed and not any(p.is_alive() for p in runner.procs), "close() left a worker running"


@pytest.mark.parametrize("layout", [{"tp": 2}, {"tp": 2, "dp": 2, "enable_dp_attention": True}])
def test_overlap_under_tp_reads_the_published_tokens_on_every_rank(layout):
    """Overlap scheduling forced on (the CPU runs it synchronously, so the engine enables it on CUDA only): decode
    rows carry token -1 and every rank reads the token rank 0 sampled and published with the step before; the
    tokens equal the synchronous tp 1 engine's."""
    from dsa_runtime.engine import Engine, EngineConfig, SamplingParams

    prompts = [[5 + i, 17, 29 + i, 41, 53] for i in range(4)]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)

    def run(overlap: bool, **fields) -> tuple[dict, list]:
        engine = Engine(EngineConfig(dtype="float32", device="cpu", **fields))
        engine._overlap = overlap
        rows: list[list[int]] = []
        real = engine.runner.run
        engine.runner.run = lambda step: (rows.append(step.rows[1].tolist()), real(step))[1]
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", p, params)
        got: dict[str, list[int]] = {}
        while engine.has_unfinished():
            for out in engine.step():
                got[out.request_id] = out.token_ids
        engine.close()  # tp 1: nothing to stop
        return got, rows

    want, _ = run(False)
    got, rows = run(True, **layout)
    assert got == want
    assert any(-1 in r for r in rows), "no step read a published token"
