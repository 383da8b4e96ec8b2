"""The former row-by-row sampler, kept as the tests' oracle for the batched one (not used by the engine).

Each row is filtered on its own on the CPU (temperature, top-k, top-p via the 256-then-4x candidate trick,
min-p) and drawn by inverse CDF in float64. :func:`draw_with` takes the uniform number explicitly so a test can
feed it the batched sampler's :func:`~dsa_runtime.engine.sampler.uniforms`; :func:`sample_rows_generators` is
the old engine entry point with per-request ``torch.Generator``s (for timing comparisons).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dsa_runtime.engine.outputs import TokenLogprob
from dsa_runtime.engine.params import SamplingParams

NUCLEUS_CANDIDATES = 256


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p on one float32 ``[V]`` row (not modified); ``-inf`` = dropped."""
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
    """Bool ``[V]``: a token is kept while the mass ranked strictly above it is below ``top_p``."""
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


def draw_with(filtered: torch.Tensor, u: float) -> int:
    """One token from ``softmax(filtered)`` for the uniform number ``u`` (inverse CDF in float64)."""
    probs = torch.softmax(filtered.double(), dim=-1)
    cdf = torch.cumsum(probs, dim=-1)
    index = int(torch.searchsorted(cdf, u * cdf[-1], right=True))
    return min(index, probs.shape[0] - 1)


def draw(filtered: torch.Tensor, generator: torch.Generator) -> int:
    """:func:`draw_with` on one uniform draw of ``generator``."""
    return draw_with(filtered, float(torch.rand((), generator=generator, dtype=torch.float64)))


def token_logprob(logits: torch.Tensor, token_id: int, top_n: int) -> TokenLogprob:
    """Log-probability of ``token_id`` under ``log_softmax(logits)`` (raw model distribution) + top ``top_n``."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    top: list[tuple[int, float]] = []
    if top_n > 0:
        values, ids = torch.topk(logp, min(top_n, logp.shape[0]))
        top = [(int(i), float(v)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    return TokenLogprob(token_id=token_id, logprob=float(logp[token_id]), top=top)


def sample_rows_generators(
    logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator]
) -> tuple[list[int], list[TokenLogprob | None]]:
    """The old engine entry point: greedy rows on the device, the others row by row on the CPU."""
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
