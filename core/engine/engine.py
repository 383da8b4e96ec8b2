"""``Engine``: synchronous continuous-batching generation over a model runner (no threads, no HTTP).

>>> engine = Engine.from_model(None)                      # doctest: +SKIP  (embedded tiny V3.2)
>>> engine.add_request("a", engine.tokenizer.encode("Hello"), SamplingParams(max_tokens=8))  # doctest: +SKIP
>>> while engine.has_unfinished():                         # doctest: +SKIP
...     for out in engine.step(): print(out.new_text, end="")

One :meth:`step` = one scheduler decision (decodes + prefill chunks under the token budget), the model over
the step's token rows (:class:`~dsa_runtime.model.step.Step`), one sampled token for every sequence whose known
tokens are now all cached.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import torch

from dsa_runtime.cache.radix import RadixCache
from dsa_runtime.engine.compile_log import install_compile_log
from dsa_runtime.engine.config import EngineConfig
from dsa_runtime.engine.detokenizer import make_detokenizer
from dsa_runtime.engine.outputs import EngineStats, RequestMetrics, RequestOutput, TokenLogprob
from dsa_runtime.engine.params import SamplingParams
from dsa_runtime.engine.parts import EngineParts
from dsa_runtime.engine.request import Request, Status
from dsa_runtime.engine.sampler import PendingSample, sample_async
from dsa_runtime.engine.scheduler import Scheduler
from dsa_runtime.engine.speculative import Speculator
from dsa_runtime.engine.stop import find_stop
from dsa_runtime.engine.structured import GrammarBackend, GrammarState
from dsa_runtime.model.batch import pack_in_order
from dsa_runtime.model.slots import SlotTable
from dsa_runtime.model.step import Step, StepKind


@dataclass
class _Launched:
    """A step whose sampling is queued: its sampled requests (row order) and their pending tokens."""

    requests: list[Request]
    pending: PendingSample
    decode_only: bool


def _groups(scheduled: list, graph_rows: int) -> list[list]:
    """The step's scheduled items as groups of one runner step each: items that fit the largest graph packed in
    order into groups of at most ``graph_rows`` rows (one replay each), the rest (long prompt chunks) one eager
    group first; without graphs one group of everything."""
    if graph_rows <= 0:
        return [scheduled]
    fits = [item.num_tokens <= graph_rows for item in scheduled]
    eager = [item for item, ok in zip(scheduled, fits, strict=True) if not ok]
    graphed = pack_in_order([item for item, ok in zip(scheduled, fits, strict=True) if ok], lambda i: i.num_tokens,
                            graph_rows)
    return ([eager] if eager else []) + graphed


class Engine:
    """Continuous-batching engine. See the module docstring and ``docs/engine.md``."""

    def __init__(self, config: EngineConfig | None = None, *, parts: EngineParts | None = None) -> None:
        self.config = config or EngineConfig()
        if parts is None:
            from dsa_runtime.engine.build import build_parts

            parts = build_parts(self.config)
        self.parts = parts
        self.runner = parts.runner
        self.tokenizer = parts.tokenizer
        self.model_config = parts.model_config
        self.model_path = parts.model_path
        self.kernel_log: tuple[str, ...] = parts.kernels.log_lines() if parts.kernels is not None else ()
        self.allocator = parts.allocator
        self.pages_total = int(parts.allocator.num_free)
        cap = self.pages_total * parts.page_size
        self.max_model_len = min(parts.max_model_len, cap)
        if self.config.max_model_len is not None:
            self.max_model_len = min(self.max_model_len, self.config.max_model_len)
        # Request slots: this host's view of the runner's per-slot device state (block tables, sampled tokens).
        self.slots = SlotTable(parts.runner.max_requests, parts.runner.max_pages)
        # Overlap scheduling pays off where the device runs asynchronously to the host (CUDA).
        self._overlap = not self.config.disable_overlap_schedule and parts.runner.device.type == "cuda"
        self._inflight: _Launched | None = None
        self._grammar: GrammarBackend | None = None  # structured output: built on the first constrained request
        self._early_outputs: list[RequestOutput] = []  # the previous step's, read early for a grammar's mask
        install_compile_log()  # DSA_LOG_COMPILES=1: every Triton compile from here on is a stall a user sees
        self.prefix_cache = None if self.config.disable_radix_cache else RadixCache(parts.allocator, parts.page_size)
        self.scheduler = Scheduler(
            parts.allocator,
            parts.page_size,
            self.config.chunked_prefill_size,
            min(self.config.max_running_requests, self.slots.max_requests),
            on_release=self._release_slot,
            prefix_cache=self.prefix_cache,
        )
        # MTP speculative decoding: decode steps draft and verify several tokens (speculative.py), synchronously.
        self._spec: Speculator | None = None
        if self.config.speculative:
            self._spec = Speculator(self, self.config.speculative_num_steps)
            self._overlap = False
            self.scheduler.lookahead = self.config.speculative_num_steps
            self.scheduler.max_model_len = self.max_model_len
        self._seeds = random.Random(self.config.seed)
        self._requests: dict[str, Request] = {}
        self._pending: list[RequestOutput] = []
        self._counters = {"prompt": 0, "generated": 0, "steps": 0}

    @classmethod
    def from_model(cls, model: str | None = None, **config_fields: Any) -> Engine:
        return cls(EngineConfig(model=model, **config_fields))

    # --- requests -------------------------------------------------------------------------------
    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams | None = None
    ) -> None:
        """Queue a request; ``ValueError`` for a duplicate id, an empty/too long prompt or bad token ids."""
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        if not isinstance(request_id, str) or not request_id:
            raise ValueError("request_id must be a non-empty string")
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already running")
        prompt = self._check_prompt(prompt_token_ids, limit=self.max_model_len)
        grammar = self._grammar_state(params) if params.structured is not None else None
        request = Request(
            request_id=request_id,
            prompt_len=len(prompt),
            token_ids=prompt,
            params=params,
            seed=params.seed if params.seed is not None else self._seeds.getrandbits(63),
            detokenizer=make_detokenizer(self.tokenizer, prompt, params.skip_special_tokens),
            metrics=RequestMetrics(arrival=time.monotonic()),
            grammar=grammar,
        )
        self._requests[request_id] = request
        self.scheduler.add(request)
        self._counters["prompt"] += len(prompt)

    def abort(self, request_id: str) -> None:
        """Stop a request now: its pages are freed at once; the next :meth:`step` reports it ``"abort"``.

        Unknown or already finished ids are ignored (a client may abort after the last token).
        """
        request = self._requests.pop(request_id, None)
        if request is None:
            return
        self.scheduler.remove(request)
        self._finish(request, "abort", None)
        self._pending.append(request.take_output())

    def has_unfinished(self) -> bool:
        """True while a request is queued or running, or an abort is still to be reported."""
        return bool(self._requests or self._pending or self._inflight)

    def close(self) -> None:
        """Stop the runner's workers, if any (a ``--tp`` / ``--dp`` engine's ranks); the engine steps no more."""
        self.runner.shutdown()

    # --- the step -------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduler iteration; outputs of the requests that produced a token, finished or were aborted.

        With overlap scheduling a pure decode step is launched before the previous step's tokens are turned
        into text: the GPU runs step N while the host detokenises and checks stops for step N-1, and step N
        reads its input tokens from the device (:attr:`RequestSlots.next_ids`). Outputs then lag one step; every
        request still ends at exactly the same token (a row run for a request that turned out finished is
        dropped).
        """
        outputs, self._pending = self._pending, []
        if self._spec is not None:
            scheduled = self.scheduler.schedule()
            return outputs + (self._spec.step(scheduled) if scheduled else [])
        if self._inflight is not None and not self._can_overlap():
            outputs += self._collect()
        scheduled = self.scheduler.schedule()
        launched = self._launch(scheduled) if scheduled else None
        outputs += self._early_outputs
        self._early_outputs = []
        if self._inflight is not None:
            outputs += self._collect()  # the previous step, while the GPU runs this one
        if launched is not None:
            self._inflight = launched
            if not (self._overlap and launched.decode_only):
                outputs += self._collect()
        return outputs

    def _can_overlap(self) -> bool:
        """Whether the next schedule can be a pure decode step launched before the in-flight tokens are known:
        nothing waits (admission and prefill need every token on the host), every running request decodes, and
        none can end by length at its in-flight token (its next step would run past max_tokens/max_model_len)."""
        if not self._overlap or self.scheduler.waiting:
            return False
        for r in self.scheduler.running:
            if not r.is_decoding:
                return False
            if r.inflight and (r.num_output_tokens + r.inflight >= r.params.max_tokens
                               or len(r.token_ids) + r.inflight >= self.max_model_len):
                return False
        return True

    def _launch(self, scheduled: list) -> _Launched | None:
        """Queue the step's forward and its sampling on the device; nothing waits for the GPU here.

        Every token of the step is a token row (a prefill chunk's tokens are rows at consecutive positions of
        their request's slot). Items that fit the largest graph are packed into groups of one replay each; a
        chunk longer than that (a long prompt) runs in one eager step, as does everything without graphs.
        """
        parts: list[torch.Tensor] = []
        requests: list[Request] = []
        groups = _groups(scheduled, self.runner.graph_rows)
        for k, group in enumerate(groups):
            logits = self._rows_step(group)
            if logits is not None:
                if k + 1 < len(groups):  # a later replay of the same bucket reuses the graph's output memory
                    logits = logits.clone()
                parts.append(logits)
                requests += [item.request for item in group if item.sample]
        sampled = [r.slot for r in requests]  # the slot of each sampled row
        self._counters["steps"] += 1
        for item in scheduled:
            request = item.request
            request.num_computed += item.num_tokens
            if item.sample and request.num_output_tokens == 0 and not request.inflight:
                self.scheduler.cache_prompt(request)  # its prompt is now computed (in stream order)
        if not requests:
            return None
        logits = parts[0] if len(parts) == 1 else torch.cat(parts)
        if any(r.grammar is not None for r in requests):
            if self._inflight is not None:
                # Overlap: the forward is queued; the mask needs the in-flight tokens in the matchers, so the
                # previous step is read here, while the GPU runs this one, and only the sampling waits for it.
                self._early_outputs += self._collect()
            self._grammar.mask(logits, [r.grammar for r in requests])
        pending = sample_async(
            logits, [r.params for r in requests], [r.seed for r in requests],
            [r.num_output_tokens + r.inflight for r in requests],  # tokens each request has sampled so far
        )
        # The next step's rows of these slots may read the tokens on the device (token -1) before the host has.
        self.runner.publish(torch.tensor(sampled, dtype=torch.int64), pending.tokens)
        for request in requests:
            request.inflight += 1
        decode_only = all(item.num_tokens == 1 and item.sample for item in scheduled)
        return _Launched(requests, pending, decode_only)

    def _collect(self) -> list[RequestOutput]:
        """Take the in-flight step's tokens (waiting for their copy only) and turn them into outputs."""
        launched, self._inflight = self._inflight, None
        tokens, logprobs = launched.pending.result()
        outputs = []
        for request, token, logprob in zip(launched.requests, tokens, logprobs, strict=True):
            request.inflight -= 1
            if request.finished:  # aborted, or ended at its previous token: this row's token is dropped
                continue
            self._append(request, token, logprob)
            outputs.append(request.take_output())
            if request.finished:
                self._requests.pop(request.request_id, None)
                self.scheduler.remove(request)
        return outputs

    def step_of(self, spans: list[tuple[Request, list[int], int]], kind: StepKind = StepKind.TARGET,
                **fields) -> Step:
        """A runner step of ``(request, tokens, first position)`` spans, in order: each request's slot acquired
        on its first step and the pages it gained since its last step written first. ``tokens`` may hold
        negative ids (device-side tokens, ``core/model/step.py``)."""
        for request, _, _ in spans:
            if request.slot < 0:
                request.slot = self.slots.acquire()
        slots: list[int] = []
        tokens: list[int] = []
        positions: list[int] = []
        for request, toks, start in spans:
            slots += [request.slot] * len(toks)
            tokens += toks
            positions += range(start, start + len(toks))
        pages = self.slots.updates([(r.slot, r.pages) for r, _, _ in spans])
        return Step.of(kind, slots, tokens, positions, pages=pages, **fields)

    def _rows_step(self, group: list) -> torch.Tensor | None:
        """Run scheduled items as one runner step; the logits ``[S, vocab]`` of its sampled items (each one's
        last row), or None when no item samples (prefill chunks that only fill the cache)."""
        spans = []
        picked: list[int] = []
        rows = 0
        for item in group:
            ids = item.request.token_ids
            # A token not on the host yet (overlap scheduling) is the slot's last sampled one: -1.
            toks = [ids[p] if p < len(ids) else -1 for p in range(item.start, item.start + item.num_tokens)]
            spans.append((item.request, toks, item.start))
            rows += item.num_tokens
            if item.sample:
                picked.append(rows - 1)
        pick = None if len(picked) == rows else torch.tensor(picked, dtype=torch.int64)
        if not picked:
            pick = torch.zeros(0, dtype=torch.int64)
        logits = self.runner.run(self.step_of(spans, pick=pick))
        return logits if picked else None

    def _grammar_state(self, params: SamplingParams) -> GrammarState:
        """A matcher for a structured-output request: ``ValueError`` for an invalid schema / regex / grammar,
        :class:`StructuredOutputUnavailable` without xgrammar. The backend is built on first use."""
        if self._grammar is None:
            self._grammar = GrammarBackend(self.tokenizer, self.model_config.vocab_size,
                                           sorted(self.parts.eos_token_ids))
        return self._grammar.state(params.structured)

    def _release_slot(self, request: Request) -> None:
        if request.slot >= 0:
            self.slots.release(request.slot)
            request.slot = -1
        request.draft_ready = False

    def _append(self, request: Request, token: int, logprob: TokenLogprob | None) -> None:
        """Add a sampled token, update the text and decide whether the request is finished."""
        params = request.params
        request.token_ids.append(token)
        self._counters["generated"] += 1
        if logprob is not None:
            request.logprobs.append(logprob)
        now = time.monotonic()
        if request.metrics.first_token is None:
            request.metrics.first_token = now
        request.metrics.last_token = now
        grammar_end = request.grammar.accept(token) if request.grammar is not None else None
        is_stop_id = token in params.stop_token_ids
        is_eos = not params.ignore_eos and token in self.parts.eos_token_ids
        if grammar_end == "stop" and token in self.parts.eos_token_ids:
            is_eos = True  # the grammar's stop token ends the request even with ignore_eos
        length_hit = (
            request.num_output_tokens >= params.max_tokens or len(request.token_ids) >= self.max_model_len
        )
        delta = ""
        if not (is_stop_id or is_eos) or (is_stop_id and params.include_stop_str_in_output):
            delta = request.detokenizer.add(token)
        if is_stop_id or is_eos or length_hit:
            delta += request.detokenizer.flush()
        request.text += delta
        match = find_stop(request.text, params.stop, len(delta))
        if match is not None:
            pos, stop = match
            request.text = request.text[: pos + (len(stop) if params.include_stop_str_in_output else 0)]
            self._finish(request, "stop", stop)
        elif is_stop_id:
            self._finish(request, "stop", token)
        elif is_eos:
            self._finish(request, "stop", None)
        elif length_hit:
            self._finish(request, "length", None)
        elif grammar_end is not None:  # terminated on a stop id of ours, or a token it refused: never "complete"
            self._finish(request, "stop" if grammar_end == "stop" else "length", None)

    def _finish(self, request: Request, reason: str, stop_reason: str | int | None) -> None:
        request.status = Status.FINISHED
        request.finish_reason = reason
        request.stop_reason = stop_reason
        request.metrics.finished = time.monotonic()

    # --- scoring ------------------------------------------------------------------------------------
    def score(self, token_ids: list[int]) -> torch.Tensor:
        """Logits at every position of one sequence: float32 ``[len, vocab]`` on the CPU (row ``i`` predicts
        token ``i + 1``), computed in chunks of ``--chunked-prefill-size`` through the paged cache.

        Uses free pages beside any running requests and returns them before it returns.
        """
        ids = self._check_prompt(token_ids, limit=self.max_model_len + 1)
        need = -(-len(ids) // self.parts.page_size)
        if self.slots.num_free == 0:
            raise ValueError(f"scoring needs a free request slot; all {self.slots.max_requests} are in use")
        pages = self.scheduler.take_pages(need)
        if not pages:
            raise ValueError(
                f"scoring {len(ids)} tokens needs {need} free KV pages; {self.scheduler.num_available} are free"
            )
        slot = self.slots.acquire()
        try:
            rows = []
            budget = self.config.chunked_prefill_size
            for start in range(0, len(ids), budget):
                chunk = ids[start : start + budget]
                step = Step.of(StepKind.TARGET, [slot] * len(chunk), chunk, list(range(start, start + len(chunk))),
                               pages=self.slots.updates([(slot, pages)]))
                rows.append(self.runner.run(step).float().cpu())
            return torch.cat(rows)
        finally:
            self.slots.release(slot)
            self.allocator.free(pages)

    def _check_prompt(self, token_ids: list[int], limit: int) -> list[int]:
        ids = [int(t) for t in token_ids]
        if not ids:
            raise ValueError("the prompt is empty (at least one token is needed)")
        vocab = self.parts.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {vocab})")
        if len(ids) >= limit:
            room = ", leaving no room to generate" if limit == self.max_model_len else ""
            raise ValueError(f"the prompt has {len(ids)} tokens; max_model_len is {self.max_model_len}{room}")
        return ids

    # --- introspection --------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        cache = self.prefix_cache
        ep_load = self.parts.ep_load
        ep_tokens, ep_imbalance = ep_load.read(self._counters["steps"]) if ep_load is not None else ((), 0.0)
        cached = cache.evictable if cache is not None else 0
        used = self.pages_total - int(self.allocator.num_free) - cached  # cached pages nobody uses count as free
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            pages_used=used,
            pages_total=self.pages_total,
            kv_usage=used / self.pages_total if self.pages_total else 0.0,
            page_size=self.scheduler.page_size,
            max_model_len=self.max_model_len,
            num_preemptions=self.scheduler.num_preemptions,
            prompt_tokens_total=self._counters["prompt"],
            generation_tokens_total=self._counters["generated"],
            steps_total=self._counters["steps"],
            pages_cached=cached,
            prefix_cache_queries_total=cache.query_tokens if cache is not None else 0,
            prefix_cache_hits_total=cache.hit_tokens if cache is not None else 0,
            spec_verifies_total=self._spec.counters.verifies if self._spec is not None else 0,
            spec_draft_tokens_total=self._spec.counters.drafted if self._spec is not None else 0,
            spec_accepted_tokens_total=self._spec.counters.accepted if self._spec is not None else 0,
            spec_emitted_tokens_total=self._spec.counters.emitted if self._spec is not None else 0,
            ep_rank_tokens_total=ep_tokens,
            ep_load_imbalance=ep_imbalance,
        )
