"""What every endpoint shares: the engine, the tokenizer, the model flavor, parsers, metrics, limits."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from dsa_runtime.engine.async_engine import AsyncEngine, EngineDeadError, EngineShuttingDown
from dsa_runtime.server.config import ModelFlavor, ServerConfig
from dsa_runtime.server.errors import APIError, bad_request, context_exceeded, unavailable
from dsa_runtime.server.metrics import ServerMetrics
from dsa_runtime.server.prompting import PromptBuilder
from dsa_runtime.server.response_store import ResponseStore

MAX_N = 16  # choices per request


@dataclass
class ServerState:
    config: ServerConfig
    engine: AsyncEngine
    model_name: str
    tokenizer: Any
    max_model_len: int
    flavor: ModelFlavor
    tool_parser: str | None
    reasoning_parser: str | None
    prompts: PromptBuilder
    metrics: ServerMetrics
    responses: ResponseStore  # stored Responses API answers (previous_response_id)
    created: int = field(default_factory=lambda: int(time.time()))
    draining: bool = False  # set on SIGINT/SIGTERM: new requests get 503 while running ones finish (launch.py)

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(
                f"The model '{model}' does not exist; this server serves '{self.model_name}'",
                status=404, param="model", code="model_not_found",
            )


def new_id(prefix: str, sep: str = "-") -> str:
    return f"{prefix}{sep}{uuid.uuid4().hex}"


def resolve_max_tokens(
    state: ServerState, requested: int | None, prompt_len: int, default: int | None, prompt_param: str = "messages"
) -> int:
    """The token budget: the request's, else ``default``, else what the context has left.

    Raises a 400 when the prompt leaves no room (naming ``prompt_param``) or the request asks for more than the
    context holds.
    """
    room = state.max_model_len - prompt_len
    if room < 1:
        raise context_exceeded(state.max_model_len, prompt_len, prompt_param)
    if requested is None:
        return min(room, default) if default else room
    if requested < 1:
        raise bad_request(f"max_tokens must be at least 1, got {requested}", param="max_tokens")
    if requested > room:
        raise bad_request(
            f"max_tokens={requested} plus the prompt's {prompt_len} tokens exceeds this model's maximum context "
            f"length of {state.max_model_len}",
            param="max_tokens", code="context_length_exceeded",
        )
    return requested


def check_n(n: int) -> None:
    if not 1 <= n <= MAX_N:
        raise bad_request(f"n must be between 1 and {MAX_N}, got {n}", param="n")


def sampling_params(**kwargs: Any) -> Any:
    """Build the engine's SamplingParams; its own validation errors become a 400."""
    from dsa_runtime.engine import SamplingParams

    try:
        return SamplingParams(**kwargs)
    except (ValueError, TypeError) as exc:
        raise bad_request(str(exc)) from None


class Tracker:
    """Records one request's latencies and token counts into the server metrics as its outputs arrive."""

    def __init__(self, metrics: ServerMetrics, arrival: float) -> None:
        self.metrics = metrics
        self.arrival = arrival
        self.last: float | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def output(self, out: Any) -> None:
        now = time.monotonic()
        count = len(out.new_token_ids)
        if count:
            if self.last is None:
                self.metrics.ttft.observe(now - self.arrival)
                m = out.metrics  # RequestMetrics, or None from an engine that keeps none
                if m is not None and m.scheduled is not None:
                    self.metrics.queue.observe(max(0.0, m.scheduled - m.arrival))
            else:
                self.metrics.itl.observe((now - self.last) / count)
            self.last = now
        self.prompt_tokens = len(out.prompt_token_ids)
        self.completion_tokens = len(out.token_ids)
        if out.finished:
            self.metrics.e2e.observe(now - self.arrival)
            self.metrics.finished(out.finish_reason or "stop")
            self.metrics.prompt_tokens.inc(self.prompt_tokens)
            self.metrics.generation_tokens.inc(self.completion_tokens)
            if out.finish_reason == "abort":
                self.metrics.aborted.inc()

    def gone(self) -> None:
        """The consumer left before the end (client disconnect): counted as aborted."""
        self.metrics.aborted.inc()
        self.metrics.finished("abort")


async def generate(
    state: ServerState, prompt_ids: list[int], params: Any, request_id: str, arrival: float
) -> AsyncIterator[Any]:
    """The engine's outputs for one choice, with metrics; engine failures become API errors."""
    tracker = Tracker(state.metrics, arrival)
    done = False
    try:
        async for out in state.engine.generate(prompt_ids, params, request_id):
            tracker.output(out)
            done = out.finished
            yield out
    except (EngineShuttingDown, EngineDeadError) as exc:
        done = True
        raise unavailable(str(exc)) from None
    except ValueError as exc:  # the engine refused the request (e.g. too long): the client's fault
        done = True
        raise bad_request(str(exc)) from None
    finally:
        if not done:
            tracker.gone()
