"""Decode token by token == one full forward == chunked prefill (several chunk sizes), both presets, both KV
layouts. Tolerances: ``helpers.FP32_TOL`` / ``BF16_TOL`` (bf16 kernel outputs bound the agreement)."""

from __future__ import annotations

import pytest
import torch

from tests.model.helpers import (
    BF16_TOL,
    FP32_TOL,
    assert_logits_close,
    make_runner,
    pages,
    run_chunks,
    tokens,
)

LENGTH = 40  # > index_topk (32) of tiny-v32: rows 0-31 attend densely, 32-39 sparsely
PREFIX = 28  # decode steps cover contexts 29..40, crossing index_topk
CHUNKS = {  # several chunk sizes over the four cases (a chunk may cross index_topk or a page boundary)
    ("tiny-v32", "bf16"): (7, 33),
    ("tiny-v32", "fp8_656"): (16,),
    ("tiny-v3", "bf16"): (16,),
    ("tiny-v3", "fp8_656"): (7, 33),
}


@pytest.mark.parametrize("kv_layout", ["bf16", "fp8_656"])
@pytest.mark.parametrize("preset", ["tiny-v32", "tiny-v3"])
def test_decode_and_chunks_match_full_forward_fp32(preset, kv_layout):
    runner = make_runner(preset, kv_layout=kv_layout, dtype=torch.float32)
    ids = tokens(LENGTH, seed=7)
    full = run_chunks(runner, ids, pages(1, LENGTH), LENGTH)
    assert full.shape == (LENGTH, runner.config.vocab_size) and full.dtype == torch.float32
    run_chunks(runner, ids[:PREFIX], pages(5, LENGTH), PREFIX)
    decoded = run_chunks(runner, ids, pages(5, LENGTH), 1, start=PREFIX)
    assert_logits_close(decoded, full[PREFIX:], what="decode vs full", **FP32_TOL)
    for i, chunk in enumerate(CHUNKS[preset, kv_layout]):
        chunked = run_chunks(runner, ids, pages(10 + 5 * i, LENGTH), chunk)
        assert_logits_close(chunked, full, what=f"chunk {chunk} vs full", **FP32_TOL)


@pytest.mark.parametrize(("preset", "kv_layout"), [("tiny-v32", "fp8_656"), ("tiny-v3", "bf16")])
def test_decode_matches_full_forward_bf16_model(preset, kv_layout):
    runner = make_runner(preset, kv_layout=kv_layout, dtype=torch.bfloat16)
    ids = tokens(LENGTH, seed=8)
    full = run_chunks(runner, ids, pages(1, LENGTH), LENGTH)
    run_chunks(runner, ids[:PREFIX], pages(5, LENGTH), PREFIX)
    decoded = run_chunks(runner, ids, pages(5, LENGTH), 1, start=PREFIX)
    assert_logits_close(decoded, full[PREFIX:], what="bf16 decode vs full", **BF16_TOL)
    chunked = run_chunks(runner, ids, pages(10, LENGTH), 11)
    assert_logits_close(chunked, full, what="bf16 chunk 11 vs full", **BF16_TOL)


def test_mha_prefill_matches_absorbed_prefill():
    """The dense MHA prefill path and the absorbed path give the same logits (short prompt, dense)."""
    ids = tokens(30, seed=9)
    mha = run_chunks(make_runner("tiny-v32", mha_max_keys=2048), ids, pages(1, 30), 30)
    absorbed = run_chunks(make_runner("tiny-v32", mha_max_keys=0), ids, pages(1, 30), 30)
    assert_logits_close(mha, absorbed, what="MHA vs absorbed", **FP32_TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_mha_prefill_matches_absorbed_sparse_prefill(dtype):
    """Past index_topk, the CPU MHA prefill over the indexer's selection equals the absorbed sparse kernels
    (whole prompt and a continued chunk crossing index_topk)."""
    ids = tokens(LENGTH, seed=10)
    mha_runner, absorbed_runner = make_runner("tiny-v32", dtype=dtype), make_runner("tiny-v32", mha_max_keys=0, dtype=dtype)
    assert mha_runner._context(None).sparse_mha_max_keys == 2048
    tol = FP32_TOL if dtype == torch.float32 else BF16_TOL
    for chunk in (LENGTH, 25):
        mha = run_chunks(mha_runner, ids, pages(1 + chunk, LENGTH), chunk)
        absorbed = run_chunks(absorbed_runner, ids, pages(1 + chunk, LENGTH), chunk)
        assert_logits_close(mha, absorbed, what=f"sparse MHA vs absorbed, chunk {chunk}", **tol)
