"""Sampling filters, draws and log-probabilities of single rows and small batches (the batched sampler).

The batched pass against the former row-by-row oracle, seeded streams and CUDA graphs: test_sampling_batched.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from dsa_runtime.engine import SamplingParams
from dsa_runtime.engine.sampler import SamplingTensors, apply_filters, sample, sample_rows


def _logits(seed: int, vocab: int = 50) -> torch.Tensor:
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * 2


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The batched filters on one float32 ``[V]`` row."""
    return apply_filters(logits[None], SamplingTensors.from_params([params], [0], [0], "cpu"))[0]


def _kept(filtered: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(filtered)).flatten().tolist())


def test_top_k_keeps_exactly_the_k_best():
    logits = _logits(0)
    kept = _kept(filter_logits(logits, SamplingParams(top_k=5)))
    assert kept == set(torch.topk(logits, 5).indices.tolist())


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    logits = _logits(1)
    temp = 0.7
    probs = torch.softmax(logits / temp, -1)
    order = torch.argsort(probs, descending=True).tolist()
    for p in (0.05, 0.3, 0.5, 0.9, 0.999):
        kept = _kept(filter_logits(logits, SamplingParams(temperature=temp, top_p=p)))
        mass, want = 0.0, set()
        for t in order:
            want.add(t)
            mass += float(probs[t])
            if mass >= p:
                break
        assert kept == want, p


@pytest.mark.parametrize("scale", [0.05, 1.0, 4.0, 12.0])  # flat (nucleus of thousands) to peaked
@pytest.mark.parametrize("top_p", [0.1, 0.6, 0.95, 0.9999])
def test_top_p_matches_a_float64_full_sort_on_large_vocabularies(scale, top_p):
    vocab = 5120
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(7)) * scale
    probs = torch.softmax(logits, -1)
    sorted_probs, order = torch.sort(probs, descending=True)
    before = torch.cumsum(sorted_probs.double(), -1) - sorted_probs.double()
    want = set(order[before < top_p].tolist())
    got = _kept(filter_logits(logits, SamplingParams(top_p=top_p)))
    # float32 vs float64 prefix sums may disagree on a token whose preceding mass is within rounding of top_p
    assert got ^ want <= {int(order[len(want) - 1]), int(order[min(len(want), vocab - 1)])}
    assert len(got ^ want) <= 1 and int(order[0]) in got


def test_min_p_drops_tokens_below_fraction_of_best():
    logits = _logits(2)
    probs = torch.softmax(logits, -1)
    kept = _kept(filter_logits(logits, SamplingParams(min_p=0.2)))
    assert kept == set(torch.nonzero(probs >= 0.2 * probs.max()).flatten().tolist())
    assert int(torch.argmax(logits)) in kept


def test_filters_compose_and_keep_the_argmax():
    logits = _logits(3)
    out = filter_logits(logits, SamplingParams(temperature=0.5, top_k=10, top_p=0.6, min_p=0.1))
    kept = _kept(out)
    assert int(torch.argmax(logits)) in kept and len(kept) <= 10
    assert torch.allclose(out[list(kept)], logits[list(kept)] / 0.5)


def test_draw_follows_the_distribution():
    probs = torch.tensor([0.5, 0.0, 0.3, 0.2])
    n = 4000
    logits = torch.log(probs).expand(n, 4)
    params = [SamplingParams(temperature=1.0)] * n
    # one request's first n tokens: the same seed, offsets 0 .. n-1
    tokens = sample(logits, SamplingTensors.from_params(params, [0] * n, list(range(n)), "cpu"))
    counts = torch.bincount(tokens, minlength=4).float()
    assert counts[1] == 0  # a zero-probability token is never drawn
    expected = probs * n
    chi2 = float(((counts - expected) ** 2 / expected.clamp(min=1e-9))[[0, 2, 3]].sum())
    assert chi2 < 13.8  # chi-square, 2 degrees of freedom, p = 0.001


def test_greedy_picks_argmax_lowest_id_on_ties():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, -1.0, 5.0, 2.0]])
    tokens, lps = sample_rows(logits, [SamplingParams(temperature=0)] * 2, [1, 2], [0, 0])
    assert tokens == [1, 0] and lps == [None, None]


def test_seeded_rows_do_not_depend_on_batch_neighbours():
    logits = torch.stack([_logits(s, 100) for s in range(5)])
    params = [SamplingParams(temperature=1.0, top_p=0.95, seed=7)] * 5
    batched = [sample_rows(logits, params, [7] * 5, [3] * 5)[0] for _ in range(3)]
    alone = [sample_rows(logits[i : i + 1], params[:1], [7], [3])[0][0] for i in range(5)]
    assert batched[0] == batched[1] == batched[2] == alone


def test_logprobs_chosen_and_top_n():
    logits = _logits(4, 30)
    ref = torch.log_softmax(logits, -1)
    tokens, lps = sample_rows(logits[None], [SamplingParams(temperature=0.8, seed=1, logprobs=3)], [1], [0])
    lp = lps[0]
    assert lp.token_id == tokens[0] and math.isclose(lp.logprob, float(ref[tokens[0]]), rel_tol=1e-6)
    assert [t for t, _ in lp.top] == torch.topk(ref, 3).indices.tolist()
    assert all(a[1] >= b[1] for a, b in zip(lp.top, lp.top[1:], strict=False))
    tokens, lps = sample_rows(logits[None], [SamplingParams(temperature=0, logprobs=0)], [0], [0])
    assert lps[0].top == [] and lps[0].token_id == tokens[0] == int(torch.argmax(logits))
    assert math.isclose(lps[0].logprob, float(ref.max()), rel_tol=1e-6)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": 0},
        {"temperature": -0.1},
        {"temperature": float("nan")},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": -2},
        {"min_p": 1.5},
        {"seed": "x"},
        {"stop": [""]},
        {"stop_token_ids": [-1]},
        {"logprobs": -1},
        {"max_tokens": True},
    ],
)
def test_bad_sampling_params_fail_with_one_message(kwargs):
    with pytest.raises(ValueError, match="^SamplingParams: "):
        SamplingParams(**kwargs)


def test_stop_accepts_a_single_string():
    assert SamplingParams(stop="END").stop == ["END"]


def test_mixed_rows_equal_each_row_alone():
    logits = torch.stack([_logits(s, 80) for s in range(4)])
    params = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.8, top_k=10, seed=1),
        SamplingParams(temperature=0, logprobs=3),
        SamplingParams(temperature=1.2, top_p=0.8, seed=2, logprobs=0),
    ]
    seeds, offsets = [100 + i for i in range(4)], [0, 5, 2, 9]
    tokens, lps = sample_rows(logits, params, seeds, offsets)
    for i in range(4):
        solo_tokens, solo_lps = sample_rows(logits[i : i + 1], params[i : i + 1], seeds[i : i + 1], offsets[i : i + 1])
        assert solo_tokens[0] == tokens[i]
        assert (lps[i] is None) == (params[i].logprobs is None) and lps[i] == solo_lps[0]
    assert tokens[0] == int(logits[0].argmax()) and tokens[2] == int(logits[2].argmax())
    assert lps[2].token_id == tokens[2] and len(lps[2].top) == 3 and lps[3].top == []
