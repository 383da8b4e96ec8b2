"""An engine with the Engine interface that emits tokens at a fixed step rate and does no model work.

It stands in for a GPU engine in front-end benches (``bench/frontend_capacity.py``): every ``step`` waits for
the next tick of a ``step_ms`` clock, then gives each running request one token of a fixed reply written in
the embedded model's tokenizer (so the server renders, tokenizes and parses exactly as it would for that
model); a step that wakes late gives each request one token per tick elapsed, so the token rate holds on a
busy machine. Requests end at ``max_tokens`` (``finish_reason="length"``); aborts free the slot at once. Picklable
config and a module-level class, so ``EngineProcess(config, build=FakeEngine)`` can run it in a child process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

REPLY = (
    "Sparse attention picks, for every query, the few thousand keys that matter most and attends to those "
    "alone, so the cost of a long context grows with the selection rather than with the whole history. "
    "An indexer scores the cached keys cheaply, a top-k keeps the best, and the main attention reads only "
    "the chosen rows. "
)


@dataclass
class FakeEngineConfig:
    """step_ms: the engine's step time (an H100 decode step of the embedded model is about 1 ms);
    max_running: the batch limit (requests past it wait); max_model_len: the context limit."""

    step_ms: float = 1.0
    max_running: int = 256
    max_model_len: int = 8192


@dataclass
class _Running:
    request_id: str
    prompt_len: int
    max_tokens: int
    arrival: float
    scheduled: float = 0.0
    first: float | None = None
    ids: list[int] | None = None


class FakeEngine:
    """See the module docstring; ``steps`` counts the steps run, ``tokens`` the tokens emitted."""

    def __init__(self, config: FakeEngineConfig) -> None:
        from dsa_runtime.loader.default_model import embedded_model_path
        from dsa_runtime.loader.tokenizer import load_tokenizer

        path = embedded_model_path()
        self.config = config
        self.tokenizer = load_tokenizer(path)
        self.max_model_len = config.max_model_len
        self.model_config = SimpleNamespace(is_dsa=True)  # V3.2: the V3.2 encoder and parsers, as for tiny-chat
        self.model_path: str | None = str(path)
        self.kernel_log: tuple[str, ...] = ()
        self._ids = self.tokenizer.encode(REPLY, add_special_tokens=False)
        self._pieces = [self.tokenizer.decode([t], skip_special_tokens=False) for t in self._ids]
        self._waiting: list[_Running] = []
        self._running: dict[str, _Running] = {}
        self._aborted: list[_Running] = []
        self._tick = time.perf_counter()
        self.steps = 0
        self.tokens = 0

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: Any) -> None:
        if len(prompt_token_ids) + params.max_tokens > self.max_model_len:
            raise ValueError(f"prompt of {len(prompt_token_ids)} tokens plus max_tokens does not fit "
                             f"{self.max_model_len}")
        if request_id in self._running or any(r.request_id == request_id for r in self._waiting):
            raise ValueError(f"request id {request_id!r} is already running")
        self._waiting.append(_Running(request_id, len(prompt_token_ids), params.max_tokens, time.monotonic(),
                                      ids=[]))

    def abort(self, request_id: str) -> None:
        req = self._running.pop(request_id, None)
        if req is None:
            req = next((r for r in self._waiting if r.request_id == request_id), None)
            if req is None:
                raise KeyError(request_id)
            self._waiting.remove(req)
        self._aborted.append(req)

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running or self._aborted)

    def close(self) -> None:
        """Nothing to stop: the fake runs in the server's process."""

    def stats(self) -> Any:
        from dsa_runtime.engine import EngineStats

        return EngineStats(num_running=len(self._running), num_waiting=len(self._waiting), pages_used=0,
                           pages_total=1, kv_usage=0.0, page_size=64, max_model_len=self.max_model_len,
                           steps_total=self.steps, generation_tokens_total=self.tokens)

    def step(self) -> list[Any]:
        from dsa_runtime.engine import RequestMetrics, RequestOutput

        period = self.config.step_ms / 1000.0
        if not self._running:  # idle until now (no request): its clock starts again, owing no ticks
            self._tick = time.perf_counter()
        self._tick += period
        delay = self._tick - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        # A late wake-up (sleep granularity, a loaded machine) still produces every tick's token: a request gets
        # one token per tick elapsed, so the token rate is the configured one, as an engine running ahead.
        late = int((time.perf_counter() - self._tick) / period)
        ticks = 1 + max(0, late)
        self._tick += late * period if late > 0 else 0.0
        now = time.monotonic()
        outputs = [RequestOutput(request_id=r.request_id, prompt_token_ids=[], token_ids=r.ids, text="",
                                 new_token_ids=[], new_text="", finished=True, finish_reason="abort")
                   for r in self._aborted]
        self._aborted = []
        while self._waiting and len(self._running) < self.config.max_running:
            req = self._waiting.pop(0)
            req.scheduled = now
            self._running[req.request_id] = req
        n = len(self._ids)
        for req in list(self._running.values()):
            start = len(req.ids)
            ks = [(start + i) % n for i in range(min(ticks, req.max_tokens - start))]
            req.ids.extend(self._ids[k] for k in ks)
            if req.first is None:
                req.first = now
            done = len(req.ids) >= req.max_tokens
            if done:
                del self._running[req.request_id]
            outputs.append(RequestOutput(
                request_id=req.request_id, prompt_token_ids=[], token_ids=req.ids, text="",
                new_token_ids=[self._ids[k] for k in ks], new_text="".join(self._pieces[k] for k in ks),
                finished=done, finish_reason="length" if done else None,
                metrics=RequestMetrics(arrival=req.arrival, scheduled=req.scheduled, first_token=req.first,
                                       last_token=now, finished=now if done else None),
            ))
            self.tokens += len(ks)
        self.steps += 1
        return outputs
