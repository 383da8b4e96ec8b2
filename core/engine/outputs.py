"""What the engine hands back: per-request outputs, token log-probabilities, timings and engine stats."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprob:
    """Log-probability of one generated token under the model (raw logits, before temperature/filters).

    ``top`` lists the ``SamplingParams.logprobs`` most likely ``(token_id, logprob)`` pairs, best first.
    """

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class RequestMetrics:
    """``time.monotonic()`` stamps of one request's life (None until reached)."""

    arrival: float
    scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None


@dataclass
class RequestOutput:
    """State of one request after a step.

    ``token_ids``/``text`` hold everything generated so far; ``new_token_ids``/``new_text`` this step's part
    (``new_text`` never ends inside a UTF-8 character, nor inside a possible stop string). ``finish_reason`` is
    ``"stop"`` (EOS, stop string or stop token), ``"length"`` (max_tokens or max model length) or ``"abort"``;
    ``stop_reason`` is the matched stop string or stop token id (None for EOS).
    """

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (OpenAI's cached_tokens)

    def merged_with(self, later: RequestOutput) -> RequestOutput:
        """``later`` (the same request's next output) carrying this one's deltas too: what a consumer that fell
        behind by a step sends as one chunk. Totals, finish state and metrics are ``later``'s."""
        later.new_token_ids = self.new_token_ids + later.new_token_ids
        later.new_text = self.new_text + later.new_text
        later.logprobs = self.logprobs + later.logprobs
        return later


@dataclass
class EngineStats:
    """A snapshot for logs and metrics endpoints."""

    num_running: int
    num_waiting: int
    pages_used: int
    pages_total: int
    kv_usage: float
    page_size: int
    max_model_len: int
    num_preemptions: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    steps_total: int = 0
    pages_cached: int = 0  # prefix-cache pages nobody references (evictable; not in pages_used)
    prefix_cache_queries_total: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits_total: int = 0  # of them, tokens found cached
    spec_verifies_total: int = 0  # MTP: verifies of a request with at least one draft token
    spec_draft_tokens_total: int = 0  # draft tokens verified
    spec_accepted_tokens_total: int = 0  # of them, accepted
    spec_emitted_tokens_total: int = 0  # tokens those verifies produced (accepted + the target's own)
    ep_rank_tokens_total: tuple[int, ...] = ()  # --ep-size: token rows each EP rank's experts received
    ep_load_imbalance: float = 0.0  # --ep-size: max / mean of those rows per step, over the last second or so

    @property
    def spec_accept_length(self) -> float:
        """Mean tokens per verify (0 without speculation)."""
        return self.spec_emitted_tokens_total / self.spec_verifies_total if self.spec_verifies_total else 0.0
