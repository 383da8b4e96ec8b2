"""Token sampling: greedy, temperature, top-k, top-p, min-p, per-request generators, log-probabilities.

Each row is filtered and drawn on its own, with its request's own ``torch.Generator``: a seeded request
therefore draws the same tokens whatever else shares its batch (no batch-shaped reductions, one uniform
number per token from its generator). Greedy rows take ``argmax`` (ties: the lowest token id).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dsa_runtime.engine.outputs import TokenLogprob
from dsa_runtime.engine.params import SamplingParams

NUCLEUS_CANDIDATES = 256


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p on one row.

    Args:
        logits: float32 ``[vocab]`` (not modified).
    Returns:
        float32 ``[vocab]`` scaled logits with filtered-out tokens at ``-inf`` (the best token always stays).
    """
    out = logits / params.temperature
    vocab = out.shape[0]
    if 0 < params.top_k < vocab:
        kth = torch.topk(out, params.top_k).values[-1]
        out = out.masked_fill(out < kth, float("-inf"))
    if params.top_p < 1.0:
        out = out.masked_fill(~nucleus_mask(torch.softmax(out, dim=-1), params.top_p), float("-inf"))
    if params.min_p > 0.0:
        probs = torch.softmax(out, dim=-1)
        out = out.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    return out


def nucleus_mask(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Bool ``[vocab]``: the smallest set of most likely tokens whose mass reaches ``top_p``.

    A token is kept while the mass ranked strictly above it is below ``top_p`` (so the best token always
    is). Exact without sorting the whole vocabulary: the ``k`` most likely tokens (256, then 4x more) hold the
    whole nucleus as soon as their mass reaches ``top_p``, since every token after them then has at least
    that much mass above it; with 129k-token vocabularies this is ~30x faster than a full sort.
    """
    vocab = probs.shape[0]
    k = min(vocab, NUCLEUS_CANDIDATES)
    while True:
        values, ids = torch.topk(probs, k)  # sorted, most likely first
        csum = torch.cumsum(values, dim=-1)
        if k == vocab or float(csum[-1]) >= top_p:
            break
        k = min(vocab, 4 * k)
    keep = (csum - values) < top_p
    return torch.zeros(vocab, dtype=torch.bool).scatter(0, ids[keep], True)


def draw(filtered: torch.Tensor, generator: torch.Generator) -> int:
    """One token from ``softmax(filtered)`` using exactly one uniform draw of ``generator``.

    Inverse-CDF in float64: the chosen token always has a non-zero probability.
    """
    probs = torch.softmax(filtered.double(), dim=-1)
    cdf = torch.cumsum(probs, dim=-1)
    u = torch.rand((), generator=generator, dtype=torch.float64)
    index = int(torch.searchsorted(cdf, u * cdf[-1], right=True))
    return min(index, probs.shape[0] - 1)


def token_logprob(logits: torch.Tensor, token_id: int, top_n: int) -> TokenLogprob:
    """Log-probability of ``token_id`` under ``log_softmax(logits)`` (raw model distribution) + top ``top_n``."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    top: list[tuple[int, float]] = []
    if top_n > 0:
        values, ids = torch.topk(logp, min(top_n, logp.shape[0]))
        top = [(int(i), float(v)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    return TokenLogprob(token_id=token_id, logprob=float(logp[token_id]), top=top)


def sample_rows(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator],
) -> tuple[list[int], list[TokenLogprob | None]]:
    """Sample one token per row.

    Args:
        logits: float32 ``[batch, vocab]`` on any device. Greedy rows are reduced there (only their argmax
            crosses to the host); rows that sample or report logprobs are copied to the CPU, where the
            per-request generators live.
        params / generators: one per row (CPU generators).
    Returns:
        token ids and, per row, a :class:`TokenLogprob` when that request asked for logprobs.
    """
    logits = logits.detach()
    tokens: list[int] = [0] * len(params)
    greedy = [i for i, p in enumerate(params) if p.greedy]
    if greedy:
        rows = logits if len(greedy) == len(params) else logits[greedy]
        for i, token in zip(greedy, torch.argmax(rows, dim=-1).tolist(), strict=True):
            tokens[i] = int(token)
    host = [i for i, p in enumerate(params) if not p.greedy or p.logprobs is not None]
    if not host:
        return tokens, [None] * len(params)
    cpu = dict(zip(host, logits[host].float().cpu(), strict=True))
    for i in host:
        if not params[i].greedy:
            tokens[i] = draw(filter_logits(cpu[i], params[i]), generators[i])
    logprobs: list[TokenLogprob | None] = [
        token_logprob(cpu[i], tokens[i], p.logprobs) if p.logprobs is not None else None
        for i, p in enumerate(params)
    ]
    return tokens, logprobs
