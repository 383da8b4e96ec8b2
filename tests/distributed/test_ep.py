"""Expert parallelism (``--ep-size``): whole experts per EP rank, tokens through the ``moe_comm`` family.

Greedy tokens of the embedded model (8 routed experts) under ``--tp 2 --ep-size 2`` (TP attention) and
``--tp 4 --dp 4 --enable-dp-attention --ep-size 4`` (with MTP once) equal ``--tp 1``; each rank holds and loads
only its experts; under DP attention no MoE layer all-reduces; the kit's ``moe_comm`` cases pass on gloo ranks;
bad flags are one-line errors."""

from __future__ import annotations

import pytest

from dsa_runtime.errors import ConfigError

PROMPTS = ["Hello there", "The quick brown fox jumps", "1 2 3"]


@pytest.fixture(scope="module")
def greedy_tp1():
    from dsa_runtime import LLM
    from dsa_runtime.engine import SamplingParams

    return [o.token_ids for o in LLM(dtype="float32", device="cpu").generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0))]


@pytest.mark.parametrize("layout", [
    {"tp": 2, "ep_size": 2},
    {"tp": 4, "dp": 4, "enable_dp_attention": True, "ep_size": 4, "moe_a2a_backend": "reference"},
], ids=["tp2-ep2", "tp4-dp4-ep4-reference"])
def test_ep_generates_the_tp1_tokens_with_experts_per_rank(greedy_tp1, layout):
    from dsa_runtime import LLM
    from dsa_runtime.engine import SamplingParams

    llm = LLM(dtype="float32", device="cpu", **layout)
    runner = llm.engine.runner
    try:
        runner.collect("tests.distributed.hooks:count_ep_calls")
        out = llm.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0))
        assert [o.token_ids for o in out] == greedy_tp1
        reports = runner.collect("tests.distributed.hooks:ep_report")
        stats = llm.engine.stats()
    finally:
        runner.shutdown()
    ep = layout["ep_size"]
    assert [r["ep_rank"] for r in reports] == list(range(ep))
    assert all(r["experts"] == [8 // ep] * 4 for r in reports), reports  # 4 MoE layers, 8 / ep experts each
    assert {r["backend"] for r in reports} == {layout.get("moe_a2a_backend", "torch")}
    # Load figures: every EP rank received rows, the counts are consistent, and max / mean >= 1.
    assert len(stats.ep_rank_tokens_total) == ep and min(stats.ep_rank_tokens_total) > 0
    assert stats.ep_load_imbalance >= 1.0
    for r in reports:
        assert r["ep_moe"] > 0
        if layout.get("enable_dp_attention"):  # only the dense layer 0 all-reduces: 1 per 4 MoE layer calls
            assert r["world_reduces"] * 4 == r["ep_moe"], r


def test_ep_under_dp_attention_with_mtp_generates_the_tp1_tokens():
    from dsa_runtime import LLM
    from dsa_runtime.engine import SamplingParams

    prompts = ["<｜User｜>What is 47 + 38?<｜Assistant｜><think>", "<｜User｜>Hello!<｜Assistant｜><think>"]
    params = SamplingParams(max_tokens=24, temperature=0)
    want = [o.token_ids for o in LLM(dtype="float32", device="cpu").generate(prompts, params)]
    llm = LLM(dtype="float32", device="cpu", speculative_algorithm="EAGLE", tp=4, dp=4, enable_dp_attention=True,
              ep_size=4)
    try:
        assert [o.token_ids for o in llm.generate(prompts, params)] == want
        assert llm.engine.stats().spec_accept_length >= 2.0
    finally:
        llm.engine.close()


def test_a_rank_loads_only_its_experts(tiny_checkpoint):
    from dataclasses import replace

    from dsa_runtime.distributed.load import load_rank_checkpoint
    from dsa_runtime.distributed.parallel import ParallelConfig
    from dsa_runtime.distributed.sharding import dict_reader, expert_index, shard_state

    full = load_rank_checkpoint(tiny_checkpoint, ParallelConfig(tp=1).rank_info(0), with_tokenizer=False)
    expert_bytes = sum(t.numel() * t.element_size() for n, t in full.tensors.items() if expert_index(n) is not None)
    parallel = ParallelConfig(tp=4, dp=4, enable_dp_attention=True, ep=2)
    for rank in range(4):
        info = parallel.rank_info(rank)
        part = load_rank_checkpoint(tiny_checkpoint, info, with_tokenizer=False)
        mine = set(range(4 * (rank % 2), 4 * (rank % 2) + 4))
        assert {expert_index(n) for n in part.tensors} - {None} == mine
        for name, t in part.tensors.items():  # whole experts as stored (FP8 + scales); the shared expert whole
            if expert_index(name) is not None or ".shared_experts." in name:
                assert t.dtype == full.tensors[name].dtype and t.shape == full.tensors[name].shape, name
        held = sum(t.numel() * t.element_size() for n, t in part.tensors.items() if expert_index(n) is not None)
        assert held * 2 == expert_bytes
        # The reader is never asked for another rank's expert (the safetensors loader reads through it too).
        reader = dict_reader(full.tensors)
        asked: list[str] = []
        reader = replace(reader, read=lambda n, *a, _read=reader.read, _asked=asked: (_asked.append(n), _read(n, *a))[1])
        shard_state(reader, info, full.config.num_hidden_layers)
        assert {expert_index(n) for n in asked} - {None} == mine


def test_ep_flags_are_clear_errors(capsys):
    from dsa_runtime.cli.main import main
    from dsa_runtime.engine.config import EngineConfig
    from dsa_runtime.plugin_manager import get_manager

    with pytest.raises(ConfigError, match=r"--ep-size 3 must divide the world size \(--tp 4\)"):
        EngineConfig(tp=4, ep_size=3)
    with pytest.raises(ConfigError, match=r"--ep-size 2 must divide the world size \(--tp 1\)"):
        EngineConfig(ep_size=2)
    assert main(["generate", "--tp", "6", "--dp", "6", "--enable-dp-attention", "--ep-size", "3",
                 "--prompt", "hi", "--max-tokens", "1"]) != 0
    assert "--ep-size 3 does not divide the model's 8 routed experts" in capsys.readouterr().err
    assert main(["generate", "--tp", "2", "--ep-size", "2", "--moe-a2a-backend", "deepep", "--prompt", "hi",
                 "--max-tokens", "1"]) != 0
    err = capsys.readouterr().err
    assert "moe_comm: backend 'deepep'" in err and "backends that can run moe_comm on cpu" in err, err
    ok, why = get_manager().get_backend("deepep").available()
    assert not ok and "deep_ep is not installed" in why


def _kit_rank(rank: int, world: int, port: int, out: str) -> None:
    import json

    import torch
    import torch.distributed as dist

    from dsa_runtime.testing import run_conformance

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    results = {}
    for backend in ("reference", "torch"):  # every rank runs the same cases in the same order
        report = run_conformance(backend, device="cpu", families=["moe_comm"], progress=False, isolate=False)
        results[backend] = [(c.id, c.status, c.message) for c in report.cases]
    dist.destroy_process_group()
    with open(f"{out}/{rank}.json", "w") as f:
        json.dump(results, f)


@pytest.mark.parametrize("world", [2, 4])
def test_kit_moe_comm_passes_on_gloo_ranks(tmp_path, world):
    """The kit's moe_comm cases across real ranks: ranks that receive nothing, one expert taking every token,
    padded rows; the reference and the fixed-capacity torch backend both pass on every rank."""
    import json

    import torch.multiprocessing as mp

    from dsa_runtime.distributed.worker import free_port

    mp.start_processes(_kit_rank, args=(world, free_port(), str(tmp_path)), nprocs=world, start_method="spawn")
    for rank in range(world):
        results = json.loads((tmp_path / f"{rank}.json").read_text())
        for backend, cases in results.items():
            bad = [c for c in cases if c[1] != "passed"]
            assert not bad and len(cases) == 18, (rank, backend, bad[:3])


def test_metrics_show_tokens_per_ep_rank():
    from dsa_runtime.engine.outputs import EngineStats
    from dsa_runtime.server.metrics import ServerMetrics

    stats = EngineStats(num_running=1, num_waiting=0, pages_used=1, pages_total=8, kv_usage=0.125, page_size=16,
                        max_model_len=64, ep_rank_tokens_total=(7, 3), ep_load_imbalance=1.4)
    text = ServerMetrics("m", lambda: stats).render()[0].decode()
    assert 'dsa:ep_rank_tokens_total{ep_rank="0",model_name="m"} 7.0' in text
    assert 'dsa:ep_rank_tokens_total{ep_rank="1",model_name="m"} 3.0' in text
    assert 'dsa:ep_load_imbalance{model_name="m"} 1.4' in text
    empty = ServerMetrics("m", lambda: None).render()[0].decode()
    assert "dsa:ep_rank_tokens_total{" not in empty
