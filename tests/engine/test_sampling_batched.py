"""The batched device sampler against the former row-by-row oracle; seeded streams; NaN safety; CUDA graphs."""

from __future__ import annotations

import random

import pytest
import torch

from dsa_runtime.engine import SamplingParams
from dsa_runtime.engine.sampler import (
    SamplingTensors,
    apply_filters,
    sample,
    sample_rows,
    sample_with_logprobs,
    uniforms,
)
from tests.engine.sampling_oracle import draw_with, filter_logits, token_logprob

CUDA = torch.cuda.is_available()
# chi-square critical values at p = 0.001 for 1 .. 9 degrees of freedom
CHI2_999 = [10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88]


def _tensors(params: list[SamplingParams], seeds=None, offsets=None, device="cpu") -> SamplingTensors:
    n = len(params)
    return SamplingTensors.from_params(
        params, seeds if seeds is not None else list(range(n)), offsets if offsets is not None else [0] * n, device
    )


def _random_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """float32 ``[rows, vocab]``: every third row rounded (ties), every fourth with ``-inf`` holes."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 3
    logits[::3] = logits[::3].round()
    holes = torch.rand(rows, vocab, generator=g) < 0.3
    holes[1::4] = False
    holes[2::4] = False
    holes[3::4] = False
    logits[holes] = float("-inf")
    logits[:, 0] = logits[:, 0].clamp(min=-30)  # at least one finite logit per row
    return logits


def _random_params(rows: int, vocab: int, seed: int) -> list[SamplingParams]:
    rng = random.Random(seed)
    return [
        SamplingParams(
            temperature=rng.choice([1e-4, 0.05, 0.7, 1.0, 3.0, 50.0]),
            top_k=rng.choice([0, -1, 1, 2, 5, vocab - 1, vocab, vocab + 5]),
            top_p=rng.choice([1e-6, 0.3, 0.9, 0.999, 1.0, 1.0]),
            min_p=rng.choice([0.0, 0.0, 0.01, 0.3, 1.0]),
        )
        for _ in range(rows)
    ]


def _kept(filtered: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(filtered)


@pytest.mark.parametrize("vocab,seed", [(7, 0), (50, 1), (300, 2), (5000, 3)])
def test_filters_match_the_row_oracle(vocab, seed):
    logits = _random_logits(48, vocab, seed)
    params = _random_params(48, vocab, seed)
    got = apply_filters(logits, _tensors(params))
    assert got.dtype == torch.float32 and got.shape == logits.shape and not torch.isnan(got).any()
    for i, p in enumerate(params):
        want = filter_logits(logits[i], p)
        mine, theirs = _kept(got[i]), _kept(want)
        assert mine.sum() == theirs.sum(), (i, p)
        differ = torch.nonzero(mine ^ theirs).flatten()
        # Only the top-p cut through a group of equal logits may pick different members: the oracle's topk
        # ranks ties in no stated order, the batched filter by token id (lowest first).
        scaled = logits[i] / p.temperature
        assert differ.numel() == 0 or (p.top_p < 1 and bool((scaled[differ] == scaled[differ[0]]).all())), (i, p)
        assert torch.equal(got[i][mine & theirs], want[mine & theirs]), (i, p)
        assert bool(mine[int(torch.argmax(logits[i]))]), (i, p)  # the best token always stays


def test_top_p_ties_rank_by_token_id():
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, 2.0, 1.0]])  # three tokens of 2.0: ids 1, 3, 4
    for top_p, want in [(0.2, {1}), (0.4, {1, 3}), (0.6, {1, 3, 4})]:
        got = apply_filters(logits, _tensors([SamplingParams(top_p=top_p)]))
        assert set(torch.nonzero(_kept(got[0])).flatten().tolist()) == want, top_p
    # exactly top_p ranked above a token (4 x 0.25, exact in float32): that token is out
    got = apply_filters(torch.zeros(1, 4), _tensors([SamplingParams(top_p=0.5)]))
    assert _kept(got[0]).tolist() == [True, True, False, False]


@pytest.mark.parametrize("vocab,seed", [(7, 4), (300, 5), (5000, 6)])
def test_draws_match_the_row_oracle_for_the_same_uniform(vocab, seed):
    logits = _random_logits(40, vocab, seed)
    params = _random_params(40, vocab, seed) + [SamplingParams(temperature=0)] * 4
    logits = torch.cat([logits, _random_logits(4, vocab, seed + 100)])
    tensors = _tensors(params, seeds=[seed * 1000 + i for i in range(44)], offsets=list(range(44)))
    tokens = sample(logits, tensors)
    filtered, u = apply_filters(logits, tensors), uniforms(tensors.seed, tensors.offset)
    assert tokens.dtype == torch.int64 and tokens.shape == (44,)
    for i, p in enumerate(params):
        want = int(torch.argmax(logits[i])) if p.greedy else draw_with(filtered[i], float(u[i]))
        assert int(tokens[i]) == want, (i, p)
        assert p.greedy or torch.isfinite(filtered[i, int(tokens[i])])


def _splitmix_uniform(seed: int, offset: int) -> float:
    """Pure-Python reference of :func:`uniforms` (uint64 arithmetic)."""
    m = (1 << 64) - 1

    def mix(z: int) -> int:
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return z ^ (z >> 31)

    z = mix((mix(seed & m) + (offset + 1) * 0x9E3779B97F4A7C15) & m)
    return (z >> 11) / 2.0**53


def test_uniforms_are_a_splitmix64_hash_of_seed_and_offset():
    seeds = [0, 1, -1, 7, 2**63 - 1, -(2**63), 2**64 + 5, 12345678901234567890, 2**62 + 3]
    offsets = [0, 1, 2, 1000, 2**40, 5, 0, 17, 2**31]
    tensors = _tensors([SamplingParams()] * len(seeds), seeds=seeds, offsets=offsets)
    got = uniforms(tensors.seed, tensors.offset)
    assert got.dtype == torch.float64
    assert got.tolist() == [_splitmix_uniform(s, o) for s, o in zip(seeds, offsets, strict=True)]
    # the same numbers whatever the seed's Python spelling (mod 2**64)
    assert _splitmix_uniform(2**64 + 5, 0) == _splitmix_uniform(5, 0)


def test_uniforms_look_uniform_and_independent_across_seeds_and_offsets():
    n = 50_000
    by_offset = uniforms(torch.zeros(n, dtype=torch.int64), torch.arange(n))
    by_seed = uniforms(torch.arange(n), torch.zeros(n, dtype=torch.int64))
    for u in (by_offset, by_seed):
        assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
        counts = torch.histc(u.float(), bins=10, min=0.0, max=1.0)
        chi2 = float(((counts - n / 10) ** 2 / (n / 10)).sum())
        assert chi2 < CHI2_999[8]
        assert abs(float(torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1])) < 0.03  # neighbours unrelated


def test_seeded_row_samples_the_same_whatever_shares_its_batch():
    vocab = 120
    row = torch.randn(vocab, generator=torch.Generator().manual_seed(9)) * 2
    target = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, min_p=0.01, seed=42)
    alone = [sample_rows(row[None], [target], [42], [n])[0][0] for n in range(30)]
    assert len(set(alone)) > 5  # really sampling
    assert [sample_rows(row[None], [target], [42], [n])[0][0] for n in range(30)] == alone  # again: same run
    rng = random.Random(0)
    for n in range(30):
        size = rng.randint(1, 40)
        at = rng.randrange(size)
        logits = _random_logits(size, vocab, n)
        logits[at] = row
        params = _random_params(size, vocab, n)
        params = [SamplingParams(temperature=0, logprobs=2) if rng.random() < 0.2 else p for p in params]
        params[at] = target
        seeds = [rng.getrandbits(63) for _ in range(size)]
        seeds[at] = 42
        offsets = [rng.randrange(100) for _ in range(size)]
        offsets[at] = n
        tokens, _ = sample_rows(logits, params, seeds, offsets)
        assert tokens[at] == alone[n], (n, size, at)


def test_offsets_continue_the_stream_like_one_request_token_by_token():
    vocab = 64
    logits = torch.randn(25, vocab, generator=torch.Generator().manual_seed(3))
    params = [SamplingParams(temperature=1.1, top_p=0.9, seed=5)] * 25
    step_by_step = [sample_rows(logits[n : n + 1], params[:1], [5], [n])[0][0] for n in range(25)]
    # a preempted request recomputed from token 10 on continues with the same offsets, hence the same tokens
    resumed = step_by_step[:10] + sample_rows(logits[10:], params[10:], [5] * 15, list(range(10, 25)))[0]
    assert resumed == step_by_step
    other_seed = sample_rows(logits, params, [6] * 25, list(range(25)))[0]
    assert other_seed != step_by_step


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, top_k=6, top_p=0.9, min_p=0.05),
        SamplingParams(temperature=1.3),
        SamplingParams(temperature=0.5, top_p=0.7),
        SamplingParams(temperature=1.0, min_p=0.2),
    ],
    ids=["all-filters", "temperature", "top-p", "min-p"],
)
def test_empirical_distribution_is_the_filtered_softmax(params):
    vocab, n = 10, 20_000
    logits = torch.tensor([2.0, 1.5, 1.4, 0.3, 0.0, -0.2, -1.0, -2.5, float("-inf"), 1.0])
    want = torch.softmax(filter_logits(logits, params).double(), -1)
    kept = want > 0
    dof = int(kept.sum()) - 1
    # one request's n tokens (offsets 0 .. n-1), then n requests' first token (seeds 0 .. n-1)
    for seeds, offsets in (([11] * n, list(range(n))), (list(range(n)), [0] * n)):
        tokens = sample(logits.expand(n, vocab), _tensors([params] * n, seeds, offsets))
        freq = torch.bincount(tokens, minlength=vocab).double() / n
        assert (freq[~kept] == 0).all()  # filtered-out tokens are never drawn
        chi2 = float((n * (freq - want)[kept] ** 2 / want[kept]).sum())
        assert chi2 < CHI2_999[dof - 1], (chi2, freq, want)
        assert float((freq - want).abs().max()) < 0.015


def test_nan_and_non_finite_rows():
    nan, inf = float("nan"), float("inf")
    logits = torch.tensor(
        [
            [nan, 1.0, 2.0, nan],  # NaN never wins: greedy 2, samples among 1 and 2
            [-inf, -inf, -inf, -inf],  # nothing to sample: argmax of the row, token 0
            [nan, nan, nan, nan],  # the same once NaN counts as -inf
            [nan, -inf, 5.0, -inf],  # only token 2 is possible
            [1.0, inf, 2.0, inf],  # +inf: no finite distribution, argmax = first +inf
        ]
    )
    for temperature in (0.0, 1.0):
        for offset in range(50):
            params = [SamplingParams(temperature=temperature, top_p=0.99, min_p=0.01, logprobs=1)] * 5
            tokens, _ = sample_rows(logits, params, [offset] * 5, [offset] * 5)
            assert tokens[0] in ((2,) if temperature == 0 else (1, 2))
            assert tokens[1:] == [0, 0, 2, 1]
    plain = sample(logits, _tensors([SamplingParams()] * 5))
    assert plain.tolist()[1:] == [0, 0, 2, 1] and int(plain[0]) in (1, 2)


def test_extreme_temperatures_are_greedy_or_finite():
    logits = torch.randn(6, 200, generator=torch.Generator().manual_seed(1)) * 5
    best = torch.argmax(logits, -1).tolist()
    assert SamplingParams(temperature=1e-300).greedy
    assert sample_rows(logits, [SamplingParams(temperature=1e-300)] * 6, list(range(6)), [0] * 6)[0] == best
    for temperature in (1e-4, 1e-5):  # not greedy: scaled logits up to ~1e6 stay finite
        params = SamplingParams(temperature=temperature, top_p=0.5, min_p=0.1)
        assert not params.greedy
        filtered = apply_filters(logits, _tensors([params] * 6))
        assert not torch.isnan(filtered).any() and torch.isfinite(filtered.amax(-1)).all()
        assert sample_rows(logits, [params] * 6, list(range(6)), [3] * 6)[0] == best
    # logits so large that dividing by the temperature overflows float32: argmax, not garbage
    huge = torch.tensor([[1e34, 3e34, 2e34]])
    assert sample_rows(huge, [SamplingParams(temperature=1e-5)], [0], [0])[0] == [1]
    # a temperature beyond float32's range: a flat distribution over the finite tokens, not NaN
    flat = torch.tensor([[1.0, float("-inf"), 3.0, 2.0]]).expand(3000, 4)
    params = [SamplingParams(temperature=1e300, top_k=10**30)] * 3000
    assert not torch.isnan(apply_filters(flat, _tensors(params))).any()
    counts = torch.bincount(torch.tensor(sample_rows(flat, params, [1] * 3000, list(range(3000)))[0]), minlength=4)
    assert counts[1] == 0 and all(abs(int(c) - 1000) < 150 for c in counts[[0, 2, 3]])


def test_logprobs_match_the_row_oracle():
    vocab = 40
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(8)) * 3
    params = [
        SamplingParams(temperature=0.7, logprobs=0),
        SamplingParams(temperature=0, logprobs=5),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=1.0, top_k=3, logprobs=1),
        SamplingParams(temperature=0, logprobs=vocab + 3),
        SamplingParams(temperature=0),
    ]
    tokens, lps = sample_rows(logits, params, list(range(6)), [2] * 6)
    for i, p in enumerate(params):
        if p.logprobs is None:
            assert lps[i] is None
            continue
        want = token_logprob(logits[i], tokens[i], p.logprobs)
        assert lps[i].token_id == want.token_id == tokens[i]
        assert lps[i].logprob == pytest.approx(want.logprob, abs=1e-6)
        assert [t for t, _ in lps[i].top] == [t for t, _ in want.top]
        assert [v for _, v in lps[i].top] == pytest.approx([v for _, v in want.top], abs=1e-6)
    assert len(lps[4].top) == vocab
    device = sample_with_logprobs(logits, _tensors(params, offsets=[2] * 6), 5)
    assert device.tokens.tolist() == tokens and device.top_ids.shape == (6, 5)


def test_sampling_tensors_from_params():
    params = [
        SamplingParams(temperature=0, top_k=5, top_p=0.5, min_p=0.2),
        SamplingParams(temperature=0.7, top_k=-1, top_p=0.9),
        SamplingParams(temperature=1e-6, top_k=3),  # greedy by the epsilon rule
        SamplingParams(temperature=1.5, top_k=7, min_p=0.1),
    ]
    t = SamplingTensors.from_params(params, [1, -1, 2**64 + 3, 2**63], [0, 4, 9, 2], "cpu")
    assert t.batch == 4
    assert t.temperature.dtype == t.top_p.dtype == t.min_p.dtype == torch.float32
    assert t.top_k.dtype == t.seed.dtype == t.offset.dtype == torch.int64 and t.greedy.dtype == torch.bool
    assert t.temperature.tolist() == pytest.approx([1.0, 0.7, 1.0, 1.5])  # greedy rows: neutral values
    assert t.top_k.tolist() == [0, 0, 0, 7] and t.top_p.tolist() == pytest.approx([1.0, 0.9, 1.0, 1.0])
    assert t.min_p.tolist() == pytest.approx([0.0, 0.0, 0.0, 0.1])
    assert t.greedy.tolist() == [True, False, True, False]
    assert t.seed.tolist() == [1, -1, 3, -(2**63)] and t.offset.tolist() == [0, 4, 9, 2]
    assert (t.any_top_k, t.max_top_k, t.any_top_p, t.any_min_p, t.all_greedy) == (True, 7, True, True, False)
    greedy = SamplingTensors.from_params([SamplingParams(temperature=0, top_p=0.5)], [0], [0], "cpu")
    assert (greedy.any_top_k, greedy.any_top_p, greedy.any_min_p, greedy.all_greedy) == (False, False, False, True)
    with pytest.raises(ValueError, match="differ in length"):
        SamplingTensors.from_params(params, [0], [0], "cpu")
    assert sample_rows(torch.zeros(0, 10), [], [], []) == ([], [])


@pytest.mark.parametrize(
    "mix",
    [
        [SamplingParams(temperature=0)] * 5,
        [SamplingParams(temperature=0.9, top_k=k) for k in (1, 3, 0, 50, 200)],
        [SamplingParams(temperature=0.9, min_p=m) for m in (0.0, 0.1, 0.5, 0.0, 0.9)],
        [SamplingParams(temperature=t) for t in (0.5, 1.0, 2.0, 0.0, 1.0)],
        [SamplingParams(temperature=0.8, top_k=9, top_p=0.8, min_p=0.05)] * 3 + [SamplingParams(temperature=0)] * 2,
    ],
    ids=["greedy", "top-k", "min-p", "temperature", "everything"],
)
def test_static_buffers_with_every_path_on_give_the_same_tokens(mix):
    """What a CUDA graph replays (every filter on, off values in the rows) equals the eager pass that skips."""
    vocab, live = 200, len(mix)
    static = SamplingTensors.empty(8, "cpu")
    logits = torch.randn(8, vocab, generator=torch.Generator().manual_seed(2)) * 2
    for offset in range(5):
        fresh = _tensors(mix, seeds=[10 + i for i in range(live)], offsets=[offset] * live)
        fresh.copy_into(static)
        assert torch.equal(sample(logits, static)[:live], sample(logits[:live], fresh))
    with pytest.raises(ValueError, match="do not fit"):
        _tensors([SamplingParams()] * 9).copy_into(static)


def test_sample_has_no_host_sync_and_no_data_dependent_shape():
    """On the meta device (no data) any ``.item()``, ``.tolist()`` or value-sized tensor would raise."""
    tensors = SamplingTensors.empty(4, "meta")
    assert sample(torch.empty(4, 1000, device="meta"), tensors).shape == (4,)
    out = sample_with_logprobs(torch.empty(4, 1000, device="meta", dtype=torch.bfloat16), tensors, 5)
    assert out.tokens.shape == out.logprob.shape == (4,) and out.top_ids.shape == out.top_logprobs.shape == (4, 5)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_sample_replays_in_a_cuda_graph_on_new_logits_and_offsets():
    dev = torch.device("cuda")
    batch, vocab = 8, 129280
    gen = torch.Generator(device=dev).manual_seed(0)
    rng = random.Random(0)

    def params_for(step: int) -> list[SamplingParams]:
        return [
            SamplingParams(temperature=0),
            SamplingParams(temperature=0.7, top_p=0.95),
            SamplingParams(temperature=1.0, top_k=50, min_p=0.05),
            SamplingParams(temperature=0.8, top_k=40, top_p=0.9),
            SamplingParams(temperature=rng.choice([0.3, 1.0, 1.7]), top_k=rng.choice([0, 5, 1000])),
            SamplingParams(temperature=1e-4, min_p=0.3),
            SamplingParams(temperature=1.2, top_p=rng.choice([0.5, 1.0])),
            SamplingParams(temperature=0.9),
        ][: batch - step % 2]  # odd steps: a shorter live batch, the last static row is padding

    static = SamplingTensors.empty(batch, dev)
    static_logits = torch.randn(batch, vocab, device=dev, generator=gen)
    _tensors(params_for(0), device=dev).copy_into(static)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the graph (allocator pools, lazy kernel loads)
        for _ in range(2):
            sample(static_logits, static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sample(static_logits, static)
    for step in range(1, 7):
        params = params_for(step)
        live = len(params)
        logits = torch.randn(live, vocab, device=dev, generator=gen) * rng.choice([1.0, 3.0])
        logits[0, ::97] = float("nan")
        fresh = _tensors(params, seeds=[100 + i for i in range(live)], offsets=[step * 3 + i for i in range(live)],
                         device=dev)
        fresh.copy_into(static)
        static_logits[:live].copy_(logits)
        graph.replay()
        torch.cuda.set_sync_debug_mode("error")  # the eager pass must not synchronise either
        try:
            eager = sample(logits, fresh)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert torch.equal(out[:live], eager), step
        cpu = sample(logits.cpu(), _tensors(params, seeds=[100 + i for i in range(live)],
                                            offsets=[step * 3 + i for i in range(live)]))
        # CUDA and CPU reduce in different orders; the same uniform numbers still pick the same tokens except
        # where a CDF boundary falls within rounding of u: allow one row in a step
        assert int((eager.cpu() != cpu).sum()) <= 1, step
