"""MTP speculative decoding (SGLang's ``--speculative-algorithm EAGLE`` with top-k 1): the checkpoint's NextN
layer drafts a chain of tokens per request, one target forward verifies them, and the longest prefix the target
agrees with is kept, plus the target's own next token.

Per step, for every decoding request with ``n`` known tokens (``x_0 .. x_{n-1}``, positions ``0 .. n-2`` cached)
and its first draft ``d_1`` (from the previous step):

1. **draft**: ``k - 1`` more chained NextN steps (``k <= --speculative-num-steps``, fewer near ``max_tokens``,
   ``max_model_len`` or the end of the request's pages, none for a structured-output request); step ``j`` runs
   at position ``n + j - 3`` on the token ``d_{j-1}`` and the previous draft step's hidden state;
2. **verify**: the target runs ``[x_{n-1}, d_1 .. d_k]`` at positions ``n-1 .. n-1+k`` as decode rows of the
   request's slot (each row sees the rows before it), and every row is sampled: ``y_i`` with the random number
   of output token ``num_output + i``;
3. **accept**: ``a`` = the longest prefix with ``d_{i+1} == y_i``; the tokens ``y_0 .. y_a`` are appended one by
   one (a stop string, stop token or length limit inside the run ends the request there);
4. **draft extend**: the NextN layer runs over positions ``n-1 .. n-1+a`` with the target's hidden states and the
   accepted tokens ``y_0 .. y_a``: its cache rows are then the target-conditioned ones, and its last row gives
   the next ``d_1`` (argmax) and the hidden state the next chain starts from.

Why the output is exactly the target's: drafts are the draft model's argmax, a point mass, so rejection sampling
(accept ``d`` with probability ``min(1, p(d) / q(d)) = p(d)``, else draw from ``p`` without ``d``) is the same
as drawing ``y ~ p`` and accepting when ``y == d``. Every ``y_i`` is drawn from the target's distribution at its
position with the same counter-based random number a non-speculative run would use for that output token, so a
seeded request produces the same tokens with and without speculation (greedy ones trivially), up to the
numerics of a verify row against a decode row.

Rejected positions leave stale rows in the target and draft caches past the accepted length; every later step
writes a position before any row reads it (a query at position ``p`` reads positions ``<= p``, and the rows
of a step are written first), so nothing stale is ever read. Prefill chunks run as usual and also feed the
NextN layer (each token's hidden state with the token after it; the final chunk's last row takes the sampled
first token), which fills the draft cache of the prompt and gives the first ``d_1``.

Speculation runs each step synchronously (no overlap scheduling), through the same runner steps as plain
decoding (``core/model/step.py``): a ``CHAIN`` step drafts, one ``TARGET`` step runs the prefill chunks and the
verifies (its rows read the drafts on the device), a ``DRAFT`` step extends; each replays a CUDA graph when one
covers its rows. Draft state lives in the runner's slot state on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dsa_runtime.engine.sampler import sample_async
from dsa_runtime.model.step import StepKind

if TYPE_CHECKING:
    from dsa_runtime.engine.engine import Engine
    from dsa_runtime.engine.outputs import RequestOutput
    from dsa_runtime.engine.request import Request
    from dsa_runtime.engine.scheduler import ScheduledSeq


@dataclass
class SpecCounters:
    """Totals since start: ``verifies`` (verify runs of a request with at least one draft), ``drafted`` (draft
    tokens verified), ``accepted`` (of them, accepted) and ``emitted`` (tokens those verifies produced)."""

    verifies: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0

    @property
    def accept_length(self) -> float:
        """Mean tokens per verify (accepted drafts + the target's own token; SGLang's ``accept length``)."""
        return self.emitted / self.verifies if self.verifies else 0.0


@dataclass
class _Verify:
    """One decoding request's verify this step: how many drafts it checks and where its rows sit."""

    request: Request
    budget: int  # draft tokens it verifies this step (0: a plain decode row)
    row0: int  # its first row in the step's TARGET rows


def _draft_token(j: int) -> int:
    """The row token id of a slot's ``j``-th draft (``j >= 1``), read from its token state on the device."""
    return -1 - j


class Speculator:
    """Runs an engine's steps with MTP speculation. ``num_steps``: most draft tokens per verify."""

    def __init__(self, engine: Engine, num_steps: int) -> None:
        if not engine.runner.nextn:
            raise ValueError("speculative decoding needs a model runner built with its NextN layer (nextn=True)")
        self.engine = engine
        self.runner = engine.runner
        self.num_steps = num_steps
        self.counters = SpecCounters()

    # --- the step ------------------------------------------------------------------------------------------------
    def step(self, scheduled: list[ScheduledSeq]) -> list[RequestOutput]:
        """Run one scheduled step (prefill chunks and decoding requests) with speculation, synchronously; the
        outputs of the requests that produced tokens (several per verify) or finished."""
        eng = self.engine
        is_verify = [item.num_tokens == 1 and item.sample and item.request.is_decoding for item in scheduled]
        chunks = [item for item, v in zip(scheduled, is_verify, strict=True) if not v]
        specs = [_Verify(item.request, self._budget(item.request), 0)
                 for item, v in zip(scheduled, is_verify, strict=True) if v]
        drafts = self._draft(specs)

        # One TARGET step: the prefill chunks' rows, then each verify's last token and drafts.
        spans: list[tuple[Request, list[int], int]] = []
        pick: list[int] = []
        chunk_rows: list[tuple[int, int]] = []  # each chunk's first row and length
        row = 0
        for item in chunks:
            spans.append((item.request, item.request.token_ids[item.start:item.start + item.num_tokens], item.start))
            chunk_rows.append((row, item.num_tokens))
            row += item.num_tokens
            if item.sample:
                pick.append(row - 1)
        for s in specs:
            r = s.request
            spans.append((r, [r.token_ids[-1], *(_draft_token(j) for j in range(1, s.budget + 1))],
                          len(r.token_ids) - 1))
            s.row0 = row
            pick += range(row, row + s.budget + 1)
            row += s.budget + 1
        logits = self.runner.run(eng.step_of(spans, pick=torch.tensor(pick, dtype=torch.int64), hidden=True))
        drafts_host = _to_host(drafts) if drafts is not None else None

        # Sample every verify row and each final chunk's last row in one pass.
        row_requests: list[Request] = []
        offsets: list[int] = []
        sampled = [item for item in chunks if item.sample]
        for item in sampled:
            row_requests.append(item.request)
            offsets.append(item.request.num_output_tokens)
        base = len(row_requests)
        for s in specs:
            row_requests += [s.request] * (s.budget + 1)
            offsets += range(s.request.num_output_tokens, s.request.num_output_tokens + s.budget + 1)
        tokens: list[int] = []
        logprobs: list = []
        if row_requests:
            if eng._grammar is not None and any(r.grammar is not None for r in row_requests):
                # Structured requests verify no drafts: each has exactly one row, at its current matcher state.
                eng._grammar.mask(logits, [r.grammar for r in row_requests])
            tokens, logprobs = sample_async(logits, [r.params for r in row_requests], [r.seed for r in row_requests],
                                            offsets).result()
        draft_ids = drafts_host.tolist() if drafts_host is not None else [[] for _ in specs]

        eng._counters["steps"] += 1
        outputs: list[RequestOutput] = []
        extend: list[tuple[Request, list[int], int]] = []  # (request, tokens, first position)
        sources: list[int] = []  # the TARGET row whose hidden state each extend row continues
        # Prefill chunks: computed; the final one's sampled token is the request's first (or next) output.
        k = 0
        for item, (row0, n) in zip(chunks, chunk_rows, strict=True):
            request = item.request
            request.num_computed += item.num_tokens
            end = item.start + item.num_tokens
            if item.sample:
                if request.num_output_tokens == 0:
                    eng.scheduler.cache_prompt(request)
                nxt = [*request.token_ids[item.start + 1:end], tokens[k]]
                k += 1
            else:
                nxt = request.token_ids[item.start + 1:end + 1]
            extend.append((request, nxt, item.start))
            sources += range(row0, row0 + n)
        for k, item in enumerate(sampled):
            self._emit(item.request, tokens[k:k + 1], logprobs[k:k + 1], outputs)
        # Verifies: accept the longest agreeing prefix plus the target's next token.
        for i, s in enumerate(specs):
            row = base + (s.row0 - specs[0].row0)
            ys = tokens[row:row + s.budget + 1]
            ds = draft_ids[i][:s.budget] if s.budget else []
            a = 0
            while a < s.budget and ds[a] == ys[a]:
                a += 1
            request = s.request
            start = request.num_computed
            request.num_computed += a + 1
            if s.budget:
                self.counters.verifies += 1
                self.counters.drafted += s.budget
                self.counters.accepted += a
                self.counters.emitted += a + 1
            extend.append((request, ys[:a + 1], start))
            sources += range(s.row0, s.row0 + a + 1)
            self._emit(request, ys[:a + 1], logprobs[row:row + a + 1], outputs)
        self._extend(extend, sources)
        return outputs

    def _emit(self, request: Request, tokens: list[int], logprobs: list, outputs: list[RequestOutput]) -> None:
        """Append ``tokens`` in order until the request finishes, then report its output once."""
        eng = self.engine
        if request.finished:
            return
        for token, logprob in zip(tokens, logprobs, strict=True):
            eng._append(request, token, logprob)
            if request.finished:
                break
        outputs.append(request.take_output())
        if request.finished:
            eng._requests.pop(request.request_id, None)
            eng.scheduler.remove(request)

    # --- drafting ------------------------------------------------------------------------------------------------
    def _budget(self, request: Request) -> int:
        """Draft tokens this request can verify now: at most ``num_steps``, leaving room for the target's own
        token under ``max_tokens`` and ``max_model_len``, within its pages; none for a grammar or before the
        request has a first draft."""
        if request.grammar is not None or not request.draft_ready or request.slot < 0:
            return 0
        n = len(request.token_ids)
        eng = self.engine
        room = min(request.params.max_tokens - request.num_output_tokens - 1, eng.max_model_len - n - 1,
                   len(request.pages) * eng.parts.page_size - n)
        return max(0, min(self.num_steps, room))

    def _draft(self, specs: list[_Verify]) -> torch.Tensor | None:
        """Each verify's draft chain, on the device, by one ``CHAIN`` step: ``[V, num_steps]`` int64 (row ``i``:
        the drafts ``d_1 .. d_k`` of ``specs[i]`` in its first ``k = budget`` columns), or None when nobody drafts.
        The runner keeps them in the slots' token state, where the verify rows read them."""
        if not any(s.budget for s in specs):
            return None
        budget = torch.tensor([s.budget for s in specs], dtype=torch.int64)
        step = self.engine.step_of([(s.request, [0], len(s.request.token_ids) - 1) for s in specs], StepKind.CHAIN,
                                   budget=budget)
        return self.runner.run(step)

    def _extend(self, items: list[tuple[Request, list[int], int]], sources: list[int]) -> None:
        """The NextN layer over the target's new hidden states (rows ``sources`` of the TARGET step), each with
        the token after it, by one ``DRAFT`` step: fills the draft cache and sets each unfinished request's next
        ``d_1`` and chain start (its last row), by slot."""
        spans: list[tuple[Request, list[int], int]] = []
        rows: list[int] = []
        pick: list[int] = []
        at = 0
        for request, toks, start in items:
            n = len(toks)
            if not request.finished:
                spans.append((request, toks, start))
                rows += sources[at:at + n]
                pick.append(len(rows) - 1)
            at += n
        if not spans:
            return
        self.runner.run(self.engine.step_of(spans, StepKind.DRAFT, pick=torch.tensor(pick, dtype=torch.int64),
                                            source=torch.tensor(rows, dtype=torch.int64)))
        for request, _, _ in spans:
            request.draft_ready = True


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` on the host, queued (pinned memory from CUDA): read it after a later sync on the stream."""
    if t.device.type != "cuda":
        return t.clone()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host
