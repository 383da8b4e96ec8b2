"""ModelRunner contract: logits modes, cache writes at the right slots (and nowhere else), input
validation before anything is written, weight loading (FP8 experts kept FP8, MTP kept aside), dtypes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dsa_runtime.loader.checkpoint import Checkpoint
from dsa_runtime.model.runner import ModelRunner
from dsa_runtime.model.seqs import ForwardBatch, ForwardSeq, forward
from dsa_runtime.reference.kv_quant import ReferenceKVQuant
from tests.model.helpers import PAGE_SIZE, kernels, make_runner, preset, tokens, weights


def _untouched(t: torch.Tensor) -> torch.Tensor:
    """Per leading index: True where every byte is still the 0xFF poison."""
    return (t.view(torch.uint8).reshape(t.shape[0], t.shape[1], -1) == 0xFF).all(dim=-1)


def test_logits_modes_and_shapes():
    runner = make_runner("tiny-v32")
    ids = tokens(9, seed=1)
    all_, last, none = forward(runner, ForwardBatch([
        ForwardSeq(ids, 0, [1], "all"), ForwardSeq(ids, 0, [2], "last"), ForwardSeq(ids, 0, [3], "none"),
    ]))
    assert all_.shape == (9, 1024) and all_.dtype == torch.float32 and torch.isfinite(all_).all()
    assert last.shape == (1024,) and none is None
    torch.testing.assert_close(last, all_[-1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("kv_layout", ["bf16", "fp8_656"])
def test_every_new_token_is_written_at_its_slot_in_every_layer(kv_layout):
    runner = make_runner("tiny-v32", kv_layout=kv_layout)
    table = [3, 7]  # 20 tokens: page 3 full, page 7 offsets 0-3
    forward(runner, ForwardBatch([ForwardSeq(tokens(20, seed=2), 0, table, "none")]))
    written = torch.zeros(runner.cache.num_pages, PAGE_SIZE, dtype=torch.bool)
    written[3, :] = True
    written[7, :4] = True
    for layer in range(runner.config.num_hidden_layers):
        assert torch.equal(~_untouched(runner.cache.mla[layer]), written), f"MLA layer {layer}"
        index = runner.cache.index_k[layer]
        keys = index[:, : PAGE_SIZE * 128].reshape(-1, PAGE_SIZE, 128)
        scales = index[:, PAGE_SIZE * 128:].reshape(-1, PAGE_SIZE, 4)
        assert torch.equal(~(keys == 0xFF).all(-1), written), f"index keys layer {layer}"
        assert torch.equal(~(scales == 0xFF).all(-1), written), f"index scales layer {layer}"
        slots = torch.tensor([3 * PAGE_SIZE + o for o in range(PAGE_SIZE)] + [7 * PAGE_SIZE + o for o in range(4)])
        _, k_scale = ReferenceKVQuant().gather_index_k(index, slots)
        assert torch.isfinite(k_scale).all() and (k_scale > 0).all()


@pytest.mark.parametrize(
    ("seq", "message"),
    [
        (ForwardSeq([], 0, [1]), "no new tokens"),
        (ForwardSeq([5], -1, [1]), "start_pos"),
        (ForwardSeq(list(range(20)), 0, [1]), "page_table has 1 pages, 2 needed"),
        (ForwardSeq([5, 6], 0, [0]), "page 0 is reserved"),
        (ForwardSeq([5, 6], 0, [999]), "page ids must be in"),
        (ForwardSeq([5, 1024], 0, [1]), "token id out of range"),
        (ForwardSeq([5], 0, [1], "first"), "logits must be"),
    ],
)
def test_bad_batches_fail_before_anything_is_written(seq, message):
    runner = make_runner("tiny-v32")
    good = ForwardSeq(tokens(4, seed=3), 0, [2], "last")
    with pytest.raises(ValueError, match=message):
        forward(runner, ForwardBatch([good, seq]))
    assert all(_untouched(t).all() for t in runner.cache.mla)
    with pytest.raises(ValueError, match="empty"):
        forward(runner, ForwardBatch([]))


def test_weights_fp8_experts_stay_fp8_and_mtp_is_kept_aside():
    runner = make_runner("tiny-v32")
    cfg = runner.config
    moe = runner.model.layers[1].ffn
    assert moe.experts.is_fp8 and moe.experts.w13.dtype == torch.float8_e4m3fn
    assert moe.experts.w13.shape == (cfg.n_routed_experts, 2 * cfg.moe_intermediate_size, cfg.hidden_size)
    assert moe.experts.w13_scale.shape == (cfg.n_routed_experts, 2, 2)
    assert moe.shared is not None and moe.shared.w2.shape == (1, cfg.hidden_size, cfg.moe_intermediate_size)
    assert runner.mtp_tensors and all(k.startswith("model.layers.3.") for k in runner.mtp_tensors)
    main_only = {k: v for k, v in weights("tiny-v32").items() if not k.startswith("model.layers.3.")}
    ckpt = Checkpoint(config=cfg, tensors=main_only, mtp_tensors={}, tokenizer=None, path=Path("."))
    again = ModelRunner.from_checkpoint(ckpt, kernels=kernels(), cache=runner.cache, dtype="float32")
    assert again.mtp_tensors == {}


def test_unquantised_checkpoint_runs_with_bf16_experts():
    from dsa_runtime.loader.random_init import random_state_dict

    cfg = preset("tiny-v3")
    runner = make_runner(cfg, random_state_dict(cfg, seed=5, fp8=False), dtype=torch.bfloat16)
    assert not runner.model.layers[1].ffn.experts.is_fp8
    out = forward(runner, ForwardBatch([ForwardSeq(tokens(6, seed=4), 0, [1], "all")]))[0]
    assert out.shape == (6, 1024) and torch.isfinite(out).all()


def test_missing_and_unexpected_tensors_are_named():
    sd = dict(weights("tiny-v32"))
    name = "model.layers.1.self_attn.indexer.wk.weight"
    del sd[name]
    with pytest.raises(KeyError, match="indexer.wk.weight"):
        make_runner(preset("tiny-v32"), sd)
    sd = dict(weights("tiny-v32"))
    sd["model.layers.0.mlp.extra.weight"] = torch.ones(2)
    with pytest.raises(ValueError, match="unexpected checkpoint tensor 'model.layers.0.mlp.extra.weight'"):
        make_runner(preset("tiny-v32"), sd)


def test_dtype_and_cache_mismatch_errors():
    with pytest.raises(ValueError, match="bfloat16 or float32"):
        make_runner("tiny-v32", dtype=torch.float16)
    runner = make_runner("tiny-v32")
    with pytest.raises(ValueError, match="different model config"):
        ModelRunner(preset("tiny-v3"), weights("tiny-v3"), kernels=kernels(), cache=runner.cache)


@pytest.mark.parametrize("name", ["tiny-v32", "tiny-v3"])
def test_index_tensors_have_the_width_the_kernels_were_resolved_for(name):
    """DSA: every index tensor is exactly index_topk wide (the ``k`` need); V3: a multiple of 64."""
    runner = make_runner(name, mha_max_keys=0)
    widths: list[int] = []
    view = runner.kernels.sparse_attn
    for method in ("prefill", "decode"):
        inner = getattr(view, method)

        def spy(q, kv, indices, *args, _inner=inner, **kwargs):
            widths.append(indices.shape[-1])
            return _inner(q, kv, indices, *args, **kwargs)

        setattr(view, method, spy)
    ids = tokens(40, seed=6)
    forward(runner, ForwardBatch([ForwardSeq(ids[:20], 0, [1, 2, 3], "none"), ForwardSeq(ids[:3], 0, [4], "none")]))
    forward(runner, ForwardBatch([ForwardSeq(ids[20:], 20, [1, 2, 3], "none"), ForwardSeq([ids[3]], 3, [4], "none")]))
    # Per layer: the first step's two prefill chunks share one call; the second step has a prefill call and
    # a decode call.
    assert len(widths) == 3 * runner.config.num_hidden_layers
    if runner.config.is_dsa:
        assert set(widths) == {runner.config.index_topk}
    else:
        assert set(widths) == {64}  # contexts of 4, 20 and 40 tokens, rounded up to 64
