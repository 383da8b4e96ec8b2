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

Speculation runs each step synchronously (no overlap scheduling). Prefill chunks run the eager forward; verify
and draft rows use the runner's decode path (CUDA graphs of both when captured).
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dsa_runtime.engine.sampler import sample_async
from dsa_runtime.model.batch import ForwardBatch, ForwardSeq
from dsa_runtime.model.decode_state import DecodePlan

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
    row0: int  # its first row among the step's verify rows (and sampled tokens)


class Speculator:
    """Runs an engine's steps with MTP speculation. ``num_steps``: most draft tokens per verify.

    Draft state lives on the device, per request slot: :attr:`first_draft` (the next ``d_1``) and
    :attr:`chain_hidden` (the hidden state its chain continues from). Drafts never visit the host before the
    verify's sampled tokens do (one copy per step), so draft steps, the verify and the extend are queued back to
    back (graph replays on CUDA).
    """

    def __init__(self, engine: Engine, num_steps: int) -> None:
        runner = engine.runner
        if not getattr(runner, "nextn", False):
            raise ValueError("speculative decoding needs a model runner built with its NextN layer (nextn=True)")
        self.engine = engine
        self.runner = runner
        self.slots = getattr(runner, "request_slots", None)
        # Without request slots (the TP runner) every forward goes through ForwardBatch: drafts visit the host
        # after each draft step, and each request's draft state is kept here instead of in slot buffers.
        self.rows_mode = self.slots is not None
        self.num_steps = num_steps
        self.counters = SpecCounters()
        self._state: weakref.WeakKeyDictionary[Request, tuple[int, torch.Tensor]] = weakref.WeakKeyDictionary()
        if self.rows_mode:
            n, device = self.slots.max_requests + 1, self.slots.device
            self.first_draft = torch.zeros(n, dtype=torch.int64, device=device)
            self.chain_hidden = torch.zeros(n, runner.config.hidden_size, dtype=runner.dtype, device=device)

    # --- the step ------------------------------------------------------------------------------------------------
    def step(self, plan: list[ScheduledSeq]) -> list[RequestOutput]:
        """Run one scheduled step (prefill chunks and decoding requests) with speculation, synchronously; the
        outputs of the requests that produced tokens (several per verify) or finished."""
        eng = self.engine
        is_verify = [item.num_tokens == 1 and item.sample and item.request.is_decoding for item in plan]
        verifies = [item.request for item, v in zip(plan, is_verify, strict=True) if v]
        chunks = [item for item, v in zip(plan, is_verify, strict=True) if not v]
        specs, drafts = self._draft(verifies)

        # Target forward: prefill chunks eagerly (with hidden states), verify rows on the decode path (or, without
        # request slots, as sequences of the same forward).
        chunk_logits: list[torch.Tensor | None] = []
        chunk_hidden: list[torch.Tensor] = []
        seqs = [ForwardSeq(item.request.token_ids[item.start:item.start + item.num_tokens], item.start,
                           item.request.pages, "last" if item.sample else "none") for item in chunks]
        if not self.rows_mode:
            seqs += [ForwardSeq([s.request.token_ids[-1], *drafts[i]], len(s.request.token_ids) - 1, s.request.pages,
                                "all") for i, s in enumerate(specs)]
        if seqs:
            chunk_logits, chunk_hidden = self.runner.forward(ForwardBatch(seqs), hidden=True)
        verify_logits = verify_hidden = None
        drafts_host = None
        if specs and not self.rows_mode:
            n = len(chunks)
            verify_logits, verify_hidden = torch.cat(chunk_logits[n:]), torch.cat(chunk_hidden[n:])
            chunk_logits, chunk_hidden = chunk_logits[:n], chunk_hidden[:n]
        elif specs:
            rows = self._rows([(s.request, [s.request.token_ids[-1]] + [0] * s.budget, len(s.request.token_ids) - 1)
                               for s in specs])
            cols = [(i, s.row0 + 1 + j) for i, s in enumerate(specs) for j in range(s.budget)]
            if cols:  # the draft tokens, from the device
                src_i, dst = zip(*cols, strict=True)
                src_j = [c - specs[i].row0 - 1 for i, c in cols]
                idx = torch.tensor([src_i, src_j, dst], dtype=torch.int64).to(rows.rows.device, non_blocking=True)
                rows.rows[1, idx[2]] = drafts[idx[0], idx[1]]
                drafts_host = _to_host(drafts)
            verify_logits, verify_hidden = self.runner.decode(rows, hidden=True)

        # Sample every verify row and each final chunk's last row in one pass.
        logits_parts: list[torch.Tensor] = []
        row_requests: list[Request] = []
        offsets: list[int] = []
        sampled = [(item, lg) for item, lg in zip(chunks, chunk_logits, strict=True) if item.sample]
        for item, lg in sampled:
            logits_parts.append(lg.reshape(1, -1))
            row_requests.append(item.request)
            offsets.append(item.request.num_output_tokens)
        base = len(row_requests)
        if specs:
            logits_parts.append(verify_logits)
            for s in specs:
                row_requests += [s.request] * (s.budget + 1)
                offsets += range(s.request.num_output_tokens, s.request.num_output_tokens + s.budget + 1)
        tokens: list[int] = []
        logprobs: list = []
        if row_requests:
            logits = logits_parts[0] if len(logits_parts) == 1 else torch.cat(logits_parts)
            if eng._grammar is not None and any(r.grammar is not None for r in row_requests):
                # Structured requests verify no drafts: each has exactly one row, at its current matcher state.
                eng._grammar.mask(logits, [r.grammar for r in row_requests])
            tokens, logprobs = sample_async(logits, [r.params for r in row_requests], [r.seed for r in row_requests],
                                            offsets).result()
        if self.rows_mode:
            draft_ids = drafts_host.tolist() if drafts_host is not None else []
        else:
            draft_ids = drafts

        eng._counters["steps"] += 1
        outputs: list[RequestOutput] = []
        extend: list[tuple[Request, list[int], int]] = []  # (request, tokens, first position)
        extend_hidden: list[torch.Tensor] = []
        # Prefill chunks: computed; the final one's sampled token is the request's first (or next) output.
        k = 0
        for item, hidden in zip(chunks, chunk_hidden, strict=True):
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
            extend_hidden.append(hidden)
        for k, (item, _) in enumerate(sampled):
            self._emit(item.request, tokens[k:k + 1], logprobs[k:k + 1], outputs)
        # Verifies: accept the longest agreeing prefix plus the target's next token.
        verify_rows: list[int] = []
        for i, s in enumerate(specs):
            row = base + s.row0
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
            verify_rows += range(s.row0, s.row0 + a + 1)
            self._emit(request, ys[:a + 1], logprobs[row:row + a + 1], outputs)
        if verify_rows:
            extend_hidden.append(verify_hidden.index_select(
                0, torch.tensor(verify_rows, dtype=torch.int64).to(verify_hidden.device, non_blocking=True)))
        self._extend(extend, torch.cat(extend_hidden) if extend_hidden else None)
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
        if request.grammar is not None or not request.draft_ready or (self.rows_mode and request.slot < 0):
            return 0
        n = len(request.token_ids)
        eng = self.engine
        room = min(request.params.max_tokens - request.num_output_tokens - 1, eng.max_model_len - n - 1,
                   len(request.pages) * eng.parts.page_size - n)
        return max(0, min(self.num_steps, room))

    def _draft(self, requests: list[Request]) -> tuple[list[_Verify], torch.Tensor | None]:
        """Each request's draft chain, on the device: ``drafts`` ``[V, num_steps]`` int64 (row ``i``: request
        ``i``'s ``d_1 .. d_k`` in its first ``k = specs[i].budget`` columns): ``d_1`` from the last extend, the
        rest from :meth:`ModelRunner.draft_chain` (one graph replay for the whole chain when captured)."""
        specs: list[_Verify] = []
        row = 0
        for request in requests:
            k = self._budget(request)
            specs.append(_Verify(request, k, row))
            row += k + 1
        if not any(s.budget for s in specs):
            return specs, None if self.rows_mode else [[] for _ in specs]
        if not self.rows_mode:
            return specs, self._draft_forward(specs)
        device = self.slots.device
        rows = self._rows([(s.request, [0], len(s.request.token_ids) - 1) for s in specs])
        slot_ids = rows.rows[0]
        first = self.first_draft[slot_ids]
        if self.num_steps == 1:
            return specs, first[:, None]
        rows.rows[1] = first
        budget = torch.tensor([s.budget for s in specs], dtype=torch.int64).to(device, non_blocking=True)
        chain = self.runner.draft_chain(rows, self.chain_hidden[slot_ids], budget)
        return specs, torch.cat([first[:, None], chain], dim=1)

    def _draft_forward(self, specs: list[_Verify]) -> list[list[int]]:
        """The draft chains through ``draft_forward`` (runners without request slots): host lists of drafts."""
        drafts = [[self._state[s.request][0]] if s.budget else [] for s in specs]
        hidden = {i: self._state[s.request][1] for i, s in enumerate(specs) if s.budget}
        for step in range(1, self.num_steps):
            active = [i for i, s in enumerate(specs) if s.budget > step]
            if not active:
                break
            batch = ForwardBatch([ForwardSeq([drafts[i][-1]], len(specs[i].request.token_ids) - 2 + step,
                                             specs[i].request.pages, "last") for i in active])
            per_seq, g = self.runner.draft_forward(batch, torch.stack([hidden[i] for i in active]))
            nxt = torch.stack(per_seq).argmax(dim=-1).tolist()
            for j, i in enumerate(active):
                drafts[i].append(int(nxt[j]))
                hidden[i] = g[j]
        return drafts

    def _extend(self, items: list[tuple[Request, list[int], int]], hidden: torch.Tensor | None) -> None:
        """The NextN layer over the target's new hidden states ``[sum of lengths, D]`` (in ``items`` order),
        each with the token after it: fills the draft cache and sets each unfinished request's next ``d_1`` and
        chain start (its last row), by slot.

        Verify-sized spans run as decode rows (a graph replay when one fits); prefill chunks through the eager
        ragged forward.
        """
        if not items:
            return
        offsets = [0, *itertools.accumulate(len(t) for _, t, _ in items)]
        short = [i for i, (_, t, _) in enumerate(items) if len(t) <= self.num_steps + 1]
        long = [i for i, (_, t, _) in enumerate(items) if len(t) > self.num_steps + 1]
        device = hidden.device
        for rows_path, group in ((True, short), (False, long)):
            group = [i for i in group if not items[i][0].finished]
            if not group:
                continue
            for i in group:
                request = items[i][0]
                if self.rows_mode and request.slot < 0:
                    request.slot = self.slots.acquire()
            rows_of = [r for i in group for r in range(offsets[i], offsets[i + 1])]
            prev = hidden.index_select(0, torch.tensor(rows_of, dtype=torch.int64).to(device, non_blocking=True))
            ends = list(itertools.accumulate(len(items[i][1]) for i in group))
            last = torch.tensor([e - 1 for e in ends], dtype=torch.int64).to(device, non_blocking=True)
            if rows_path and self.rows_mode:
                logits, g = self.runner.draft_decode(self._rows([items[i] for i in group]), prev)
                logits = logits.index_select(0, last)
            else:
                batch = ForwardBatch([ForwardSeq(items[i][1], items[i][2], items[i][0].pages, "last")
                                      for i in group])
                per_seq, g = self.runner.draft_forward(batch, prev)
                logits = torch.stack(per_seq)
            if self.rows_mode:
                slot_ids = torch.tensor([items[i][0].slot for i in group], dtype=torch.int64).to(device, non_blocking=True)
                self.first_draft[slot_ids] = logits.argmax(dim=-1)
                self.chain_hidden[slot_ids] = g.index_select(0, last).to(self.chain_hidden.dtype)
            else:
                firsts = logits.argmax(dim=-1).tolist()
                g_last = g.index_select(0, last)
                for j, i in enumerate(group):
                    self._state[items[i][0]] = (int(firsts[j]), g_last[j])
            for i in group:
                items[i][0].draft_ready = True

    def _rows(self, spans: list[tuple[Request, list[int], int]]) -> DecodePlan:
        """Decode-shaped plan rows for ``(request, tokens, first position)`` spans (slots acquired and synced)."""
        slots = self.slots
        for request, _, _ in spans:
            if request.slot < 0:
                request.slot = slots.acquire()
        slots.sync([(r.slot, r.pages) for r, _, _ in spans])
        row_slots: list[int] = []
        tokens: list[int] = []
        positions: list[int] = []
        for request, toks, start in spans:
            row_slots += [request.slot] * len(toks)
            tokens += toks
            positions += range(start, start + len(toks))
        plan = DecodePlan.from_lists(row_slots, tokens, positions)
        plan.rows = plan.rows.to(slots.device, non_blocking=True)
        return plan


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` on the host, queued (pinned memory from CUDA): read it after a later sync on the stream."""
    if t.device.type != "cuda":
        return t.clone()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host
