"""MTP speculation on a GPU with CUDA graphs (bf16 model, bf16 and FP8 KV caches): the draft and verify steps
replay graphs, greedy output matches plain decoding (up to bf16 verify-vs-decode rounding: at most one request in
eight may differ), most drafts of the trained NextN layer are accepted, and an abort inside a run frees
everything."""

from __future__ import annotations

import gc

import pytest
import torch

from dsa_runtime.engine import Engine, EngineConfig, SamplingParams
from tests.engine.helpers import run_all

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CHATS = ["What is 47 + 38?", "Hello!", "What is the capital of France?", "Convert 5 km to meters.",
         "What is 12 * 9?", "What is 305 - 17?", "Hi, who are you?", "Convert 3 kg to grams."]


# A bounded KV cache: the GPU suite runs tests in parallel workers beside the conformance kit, and an engine's
# default --mem-fraction-static would take most of the GPU.
SMALL = {"max_running_requests": 16, "max_total_tokens": 16384}


def _outputs(engine: Engine, max_tokens: int = 120) -> dict[str, list[int]]:
    for i, c in enumerate(CHATS):
        engine.add_request(f"q{i}", engine.tokenizer.encode(f"<｜User｜>{c}<｜Assistant｜><think>"),
                           SamplingParams(temperature=0, max_tokens=max_tokens))
    return {rid: outs[-1].token_ids for rid, outs in run_all(engine).items()}


@pytest.mark.parametrize("kv_cache_dtype", ["bf16", "fp8_e4m3"])
def test_graphed_speculation_matches_plain_decoding_and_accepts_most_drafts(kv_cache_dtype):
    base = Engine(EngineConfig(**SMALL, kv_cache_dtype=kv_cache_dtype))
    plain = _outputs(base)
    del base
    gc.collect()
    torch.cuda.empty_cache()
    engine = Engine(EngineConfig(**SMALL, kv_cache_dtype=kv_cache_dtype, speculative_algorithm="EAGLE"))
    from dsa_runtime.model.step import StepKind

    assert set(engine.runner.graphs) == {StepKind.TARGET, StepKind.DRAFT, StepKind.CHAIN}
    spec = _outputs(engine)
    differing = [rid for rid in plain if plain[rid] != spec[rid]]
    assert len(differing) <= 1, differing
    stats = engine.stats()
    assert stats.spec_accept_length >= 2.5
    engine.add_request("a", engine.tokenizer.encode("<｜User｜>Hello!<｜Assistant｜><think>"),
                       SamplingParams(temperature=0, max_tokens=100))
    engine.step()
    engine.step()
    engine.abort("a")
    assert run_all(engine)["a"][-1].finish_reason == "abort"
    assert engine.stats().pages_used == 0
    del engine
    gc.collect()
    torch.cuda.empty_cache()
