"""Token sampling on the logits' device: one vectorised pass over the whole batch.

Greedy rows take ``argmax`` (ties: the lowest token id). Sampled rows are scaled by their temperature, then
filtered by top-k (ties with the k-th value kept), top-p (a token is kept while the mass ranked strictly above
it is below ``top_p``; equal probabilities rank by token id) and min-p (relative to the most likely token),
then drawn by inverse CDF in float64 over the filtered probabilities in token-id order.

Randomness is counter based: each row's single uniform number is a splitmix64 hash of ``(seed, offset)``
computed on the device, where ``offset`` is how many tokens the request has sampled so far. A seeded request
therefore draws the same tokens whatever else shares its batch, at whatever row it sits, across runs, and
after a preemption (its offset does not move while it is recomputed).

:func:`sample` / :func:`sample_with_logprobs` have no host synchronisation, no data-dependent shapes and no
Python branching on tensor values, so they can be captured in a CUDA graph; the only host decisions come from
:class:`SamplingTensors`' flags, which are computed from the parameters. :func:`sample_rows` is the engine's
entry point: one batched pass and exactly one device-to-host copy.

NaN logits are treated as ``-inf`` (never sampled, never the argmax). A row whose filtered distribution has no
finite mass (every logit ``-inf`` or NaN, a ``+inf`` logit, or scaled logits that overflow) falls back to the
argmax of its NaN-cleaned logits, i.e. token 0 when every logit is ``-inf``/NaN: a defined token instead of a
NaN-driven one, the same choice a greedy request would make.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from dsa_runtime.engine.outputs import TokenLogprob
from dsa_runtime.engine.params import SamplingParams

_NEG_INF = float("-inf")
# Host-side caps: a finite float64 temperature above float32's range would become inf (and -inf / inf is NaN);
# a top_k past int64 would not fit the tensor, and anything >= the vocabulary means "off" anyway.
_MAX_TEMPERATURE = torch.finfo(torch.float32).max
_MAX_TOP_K = 2**31 - 1


def _signed64(value: int) -> int:
    """``value`` mod 2**64 as a signed int64 (torch has no general uint64 arithmetic)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


# splitmix64 (Steele, Lea & Flood 2014; the seeding generator of xoshiro): increment and finaliser constants.
_GOLDEN = _signed64(0x9E3779B97F4A7C15)
_MIX1 = _signed64(0xBF58476D1CE4E5B9)
_MIX2 = _signed64(0x94D049BB133111EB)


@dataclass(eq=False)
class SamplingTensors:
    """Per-row sampling parameters of one batch, on the logits' device.

    Tensors (all ``[B]``): ``temperature`` float32 (1.0 on greedy rows, so dividing by it is harmless);
    ``top_k`` int64 (0 = off; values >= the vocabulary are off too); ``top_p`` float32 (1.0 = off); ``min_p``
    float32 (0.0 = off); ``greedy`` bool; ``seed`` int64 (the request's seed mod 2**64); ``offset`` int64 (tokens
    the request has sampled so far). Greedy rows carry neutral filter values.

    Flags (host values computed from the parameters, never from tensor values) let a batch skip work no row
    needs: ``any_top_k`` / ``any_top_p`` / ``any_min_p`` (some sampled row has that filter on), ``max_top_k``
    (largest ``top_k`` of those rows; ``None`` = up to the vocabulary) and ``all_greedy``. A filter that is
    skipped or applied with a row's off value leaves that row unchanged, so the flags change speed, not tokens.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    greedy: torch.Tensor
    seed: torch.Tensor
    offset: torch.Tensor
    any_top_k: bool = True
    max_top_k: int | None = None
    any_top_p: bool = True
    any_min_p: bool = True
    all_greedy: bool = False

    @property
    def batch(self) -> int:
        """Number of rows ``B``."""
        return int(self.temperature.shape[0])

    @classmethod
    def from_params(
        cls,
        params: Sequence[SamplingParams],
        seeds: Sequence[int],
        offsets: Sequence[int],
        device: torch.device | str,
    ) -> SamplingTensors:
        """Build the batch's tensors with one host-to-device copy per dtype group (float32, int64).

        Args:
            params: one per row.
            seeds: one per row, any Python int (reduced mod 2**64).
            offsets: one per row, tokens that row's request has sampled so far (>= 0).
            device: where the logits live.
        """
        if not len(params) == len(seeds) == len(offsets):
            raise ValueError(
                f"params, seeds and offsets differ in length: {len(params)}, {len(seeds)}, {len(offsets)}"
            )
        sampled = [p for p in params if not p.greedy]
        floats = torch.tensor(
            [
                [1.0 if p.greedy else min(p.temperature, _MAX_TEMPERATURE) for p in params],
                [1.0 if p.greedy else p.top_p for p in params],
                [0.0 if p.greedy else p.min_p for p in params],
            ],
            dtype=torch.float32,
        ).reshape(3, len(params))
        top_k = [0 if p.greedy else min(max(p.top_k, 0), _MAX_TOP_K) for p in params]
        ints = torch.tensor(
            [top_k, [_signed64(s) for s in seeds], list(offsets), [int(p.greedy) for p in params]],
            dtype=torch.int64,
        ).reshape(4, len(params))
        floats, ints = _to_device(floats, device), _to_device(ints, device)
        return cls(
            temperature=floats[0],
            top_p=floats[1],
            min_p=floats[2],
            top_k=ints[0],
            seed=ints[1],
            offset=ints[2],
            greedy=ints[3].bool(),
            any_top_k=any(k > 0 for k in top_k),
            max_top_k=max(top_k, default=0),
            any_top_p=any(p.top_p < 1.0 for p in sampled),
            any_min_p=any(p.min_p > 0.0 for p in sampled),
            all_greedy=not sampled,
        )

    @classmethod
    def empty(cls, batch: int, device: torch.device | str) -> SamplingTensors:
        """Static buffers for a CUDA graph: ``batch`` greedy rows, every flag on (the graph takes every path).

        Fill them before each replay with :meth:`copy_into`; rows past the live batch keep old valid values.
        """
        return cls(
            temperature=torch.ones(batch, dtype=torch.float32, device=device),
            top_k=torch.zeros(batch, dtype=torch.int64, device=device),
            top_p=torch.ones(batch, dtype=torch.float32, device=device),
            min_p=torch.zeros(batch, dtype=torch.float32, device=device),
            greedy=torch.ones(batch, dtype=torch.bool, device=device),
            seed=torch.zeros(batch, dtype=torch.int64, device=device),
            offset=torch.zeros(batch, dtype=torch.int64, device=device),
        )

    def copy_into(self, static: SamplingTensors) -> None:
        """Copy these rows into the first ``self.batch`` rows of ``static``'s buffers (device to device).

        ``static``'s flags are kept: a graph captured with every path on is right for any batch.
        """
        if self.batch > static.batch:
            raise ValueError(f"{self.batch} rows do not fit static buffers of {static.batch}")
        for name in ("temperature", "top_k", "top_p", "min_p", "greedy", "seed", "offset"):
            getattr(static, name)[: self.batch].copy_(getattr(self, name))


def _to_device(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``host`` on ``device``; from pinned memory to CUDA, so the copy does not block the host."""
    device = torch.device(device)
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


# --- the device pass --------------------------------------------------------------------------------------------
def clean_logits(logits: torch.Tensor) -> torch.Tensor:
    """float32 ``[B, V]`` copy of ``logits`` (any float dtype) with NaN replaced by ``-inf``."""
    # posinf/neginf given explicitly: nan_to_num's defaults would turn infinities into finite extremes.
    return torch.nan_to_num(logits.detach().float(), nan=_NEG_INF, posinf=float("inf"), neginf=_NEG_INF)


def apply_filters(logits: torch.Tensor, tensors: SamplingTensors) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p on every row.

    Args:
        logits: ``[B, V]`` float (not modified); NaN counts as ``-inf``.
        tensors: the batch's parameters (greedy rows get temperature 1 and no filter).
    Returns:
        float32 ``[B, V]`` scaled logits with filtered-out tokens at ``-inf`` (the best token always stays).
    """
    return _filter(clean_logits(logits), tensors)


def _filter(clean: torch.Tensor, tensors: SamplingTensors) -> torch.Tensor:
    """:func:`apply_filters` on already cleaned float32 ``[B, V]`` logits."""
    out = clean / tensors.temperature[:, None]
    vocab = out.shape[-1]
    if tensors.any_top_p:
        # One descending sort serves top-k (its k-th value) and top-p (its order); stable, so equal values rank
        # by token id and the nucleus does not depend on the sort implementation.
        values, order = torch.sort(out, dim=-1, descending=True, stable=True)
        if tensors.any_top_k:
            out = _top_k(out, values, tensors.top_k)
        out = _top_p(out, order, tensors.top_p)
    elif tensors.any_top_k:
        # Only the k-th values are needed: the largest k of the batch is known on the host.
        k = vocab if tensors.max_top_k is None else min(max(tensors.max_top_k, 1), vocab)
        out = _top_k(out, torch.topk(out, k, dim=-1).values, tensors.top_k)
    if tensors.any_min_p:
        out = _min_p(out, tensors.min_p)
    return out


def _top_k(scaled: torch.Tensor, sorted_values: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Drop tokens below each row's k-th largest value (ties with it stay).

    Args:
        scaled: float32 ``[B, V]``.
        sorted_values: float32 ``[B, W]``, each row's ``W >= max(top_k)`` largest values, descending.
        top_k: int64 ``[B]``; rows with ``top_k <= 0`` or ``>= V`` are left unchanged.
    """
    vocab, width = scaled.shape[-1], sorted_values.shape[-1]
    on = (top_k > 0) & (top_k < vocab)
    kth = sorted_values.gather(1, (top_k.clamp(1, width) - 1)[:, None])
    kth = torch.where(on[:, None], kth, _NEG_INF)
    return scaled.masked_fill(scaled < kth, _NEG_INF)


def _top_p(scaled: torch.Tensor, order: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep each row's nucleus: tokens whose mass ranked strictly above them is below ``top_p``.

    Args:
        scaled: float32 ``[B, V]`` (after top-k).
        order: int64 ``[B, V]``, token ids by descending ``scaled`` (a full sort of the pre-top-k logits: top-k
            only moved tokens to ``-inf`` below every kept one, so the order of kept tokens is unchanged).
        top_p: float32 ``[B]``; rows with ``top_p >= 1`` are left unchanged.
    """
    # Softmax in token order, then gathered: the probabilities are bit-identical to a per-row softmax.
    probs = torch.softmax(scaled, dim=-1).gather(1, order)
    above = torch.cumsum(probs, dim=-1) - probs
    # Off rows keep everything explicitly: float32 prefix sums may round to >= 1 before the last token.
    keep_sorted = (above < top_p[:, None]) | (top_p >= 1.0)[:, None]
    keep = torch.empty_like(keep_sorted).scatter_(1, order, keep_sorted)
    return scaled.masked_fill(~keep, _NEG_INF)


def _min_p(scaled: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below ``min_p`` times the row's best (``min_p`` float32 ``[B]``, 0 = off)."""
    probs = torch.softmax(scaled, dim=-1)
    limit = min_p[:, None] * probs.amax(dim=-1, keepdim=True)
    return scaled.masked_fill(probs < limit, _NEG_INF)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 ``x`` (torch's ``>>`` is arithmetic on signed values, so mask the sign)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix64(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 ``[B]`` (torch int64 multiplication wraps mod 2**64, as uint64 would)."""
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


def uniforms(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """One uniform number in ``[0, 1)`` per row: a hash of ``(seed, offset)``.

    The ``offset + 1``-th output of a splitmix64 stream whose state starts at ``mix64(seed)`` (mixing the seed
    first keeps nearby seeds from giving shifted copies of one stream); its top 53 bits make the float64.

    Args:
        seed, offset: int64 ``[B]``.
    Returns:
        float64 ``[B]``.
    """
    z = _mix64(_mix64(seed) + (offset + 1) * _GOLDEN)
    return _shift_right(z, 11).double() * 2.0**-53


def _draw(filtered: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse-CDF draw per row in float64, in token-id order.

    Args:
        filtered: float32 ``[B, V]`` filtered logits.
        u: float64 ``[B]`` uniform numbers in ``[0, 1)``.
    Returns:
        int64 ``[B]`` token ids and bool ``[B]`` (the row had a finite, positive mass to draw from).
    """
    cdf = torch.cumsum(torch.softmax(filtered.double(), dim=-1), dim=-1)
    total = cdf[:, -1:]
    # Strictly below the total, so the first cdf entry above the target always belongs to a token of non-zero
    # probability even when u * total rounds up to the total.
    target = torch.minimum(u[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    index = torch.searchsorted(cdf, target, right=True).squeeze(1)
    valid = (torch.isfinite(total) & (total > 0)).squeeze(1)
    return index.clamp(max=filtered.shape[-1] - 1), valid


def _sample_clean(clean: torch.Tensor, tensors: SamplingTensors) -> torch.Tensor:
    """:func:`sample` on cleaned float32 ``[B, V]`` logits."""
    best = torch.argmax(clean, dim=-1)  # first maximum: ties go to the lowest token id
    if tensors.all_greedy:
        return best
    drawn, valid = _draw(_filter(clean, tensors), uniforms(tensors.seed, tensors.offset))
    return torch.where(tensors.greedy | ~valid, best, drawn)


def sample(logits: torch.Tensor, tensors: SamplingTensors) -> torch.Tensor:
    """One token per row, on ``logits``' device, without host synchronisation (CUDA-graph capturable).

    Args:
        logits: ``[B, V]`` float (not modified).
        tensors: the batch's parameters on the same device.
    Returns:
        int64 ``[B]`` token ids.
    """
    return _sample_clean(clean_logits(logits), tensors)


class SampledLogprobs(NamedTuple):
    """Device result of :func:`sample_with_logprobs` (``B`` rows, ``N`` = ``top_n`` clipped to the vocabulary)."""

    tokens: torch.Tensor  # int64 [B]
    logprob: torch.Tensor  # float32 [B]: the chosen token's log-probability
    top_logprobs: torch.Tensor  # float32 [B, N], descending
    top_ids: torch.Tensor  # int64 [B, N]


def sample_with_logprobs(logits: torch.Tensor, tensors: SamplingTensors, top_n: int) -> SampledLogprobs:
    """:func:`sample` plus log-probabilities under the raw model distribution (``log_softmax`` of the logits,
    before temperature and filters; NaN counted as ``-inf``): the chosen token's and each row's top ``top_n``.
    """
    clean = clean_logits(logits)
    tokens = _sample_clean(clean, tensors)
    logp = torch.log_softmax(clean, dim=-1)
    chosen = logp.gather(1, tokens[:, None]).squeeze(1)
    top_values, top_ids = torch.topk(logp, min(max(top_n, 0), logp.shape[-1]), dim=-1)
    return SampledLogprobs(tokens, chosen, top_values, top_ids)


# --- the engine's entry point ------------------------------------------------------------------------------------
class PendingSample:
    """A sampled batch whose device work is queued: ``tokens`` ``[B]`` int64 stay on the device (the next decode
    step can read them there), and one packed copy to pinned host memory is on its way; :meth:`result` waits
    for that copy alone (not for work queued after it) and unpacks it."""

    def __init__(self, tokens: torch.Tensor, packed: torch.Tensor, params: Sequence[SamplingParams],
                 width: int) -> None:
        self.tokens = tokens
        self.params = list(params)
        self.width = width
        self._host = packed
        self._event = None
        if packed.device.type == "cuda":
            self._host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            self._host.copy_(packed, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()

    def result(self) -> tuple[list[int], list[TokenLogprob | None]]:
        """Token ids and, per row, a :class:`TokenLogprob` when that request asked for logprobs."""
        if self._event is not None:
            self._event.synchronize()
        rows = self._host.tolist()
        if self._host.dim() == 1:
            return [int(t) for t in rows], [None] * len(rows)
        width = self.width
        tokens = [int(row[0]) for row in rows]
        logprobs: list[TokenLogprob | None] = []
        for p, row in zip(self.params, rows, strict=True):
            if p.logprobs is None:
                logprobs.append(None)
                continue
            n = min(p.logprobs, width)
            top = [(int(row[2 + width + j]), row[2 + j]) for j in range(n)]
            logprobs.append(TokenLogprob(token_id=int(row[0]), logprob=row[1], top=top))
        return tokens, logprobs


def sample_async(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    seeds: Sequence[int],
    offsets: Sequence[int],
) -> PendingSample:
    """Queue one batched device pass over ``logits`` ``[B, V]`` and the copy of its result to the host.

    Args:
        params / seeds / offsets: one per row; ``offsets[i]`` = tokens row ``i``'s request has sampled so far.
    """
    tensors = SamplingTensors.from_params(params, seeds, offsets, logits.device)
    asked = [p.logprobs for p in params if p.logprobs is not None]
    if not asked:
        tokens = sample(logits, tensors)
        return PendingSample(tokens, tokens, params, 0)
    out = sample_with_logprobs(logits, tensors, max(asked))
    # One copy for everything: float64 holds the token ids (< 2**53) and the float32 logprobs exactly.
    packed = torch.cat(
        [out.tokens[:, None].double(), out.logprob[:, None].double(), out.top_logprobs.double(),
         out.top_ids.double()],
        dim=1,
    )
    return PendingSample(out.tokens, packed, params, out.top_ids.shape[-1])


def sample_rows(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    seeds: Sequence[int],
    offsets: Sequence[int],
) -> tuple[list[int], list[TokenLogprob | None]]:
    """Sample one token per row with one batched device pass and one device-to-host copy.

    Args:
        logits: ``[B, V]`` float on any device.
        params / seeds / offsets: one per row; ``offsets[i]`` = tokens row ``i``'s request has sampled so far.
    Returns:
        token ids and, per row, a :class:`TokenLogprob` when that request asked for logprobs.
    """
    if len(params) == 0:
        return [], []
    return sample_async(logits, params, seeds, offsets).result()
