"""IndexCache on a GPU (bf16, CUDA graphs, the embedded model with contexts past its index_topk of 128): an
all-Full pattern gives the default engine's greedy tokens, and a sharing pattern runs through prefill and the
captured decode graphs (Shared layers read the memo inside the graph)."""

from __future__ import annotations

import gc
import random

import pytest
import torch

from dsa_runtime.engine import Engine, EngineConfig, SamplingParams
from tests.engine.helpers import run_all

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _run(override: str | None) -> dict[str, list[int]]:
    engine = Engine(EngineConfig(max_running_requests=8, max_total_tokens=8192, json_model_override_args=override))
    assert engine.runner.graphs
    rng = random.Random(1)
    for i, n in enumerate((150, 260, 200)):
        engine.add_request(f"q{i}", [rng.randrange(3, 3000) for _ in range(n)],
                           SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    out = {rid: outs[-1].token_ids for rid, outs in run_all(engine).items()}
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    return out


def test_index_cache_patterns_under_cuda_graphs():
    plain = _run(None)
    assert _run('{"index_topk_pattern": "FFFFF"}') == plain
    shared = _run('{"index_topk_pattern": "FSFSS"}')
    assert {k: len(v) for k, v in shared.items()} == dict.fromkeys(plain, 24)
