"""``SamplingParams``: how one request samples and when it stops.

Validation happens at construction, so a bad request fails at ``add_request`` with one clear message
(``ValueError``) instead of deep inside a step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dsa_runtime.engine.structured import StructuredOutput

# Temperatures below this sample greedily (vLLM's _SAMPLING_EPS): dividing logits by, say, 1e-300 overflows them
# to inf, and softmax over infs is NaN, so a "tiny" temperature would sample garbage instead of the argmax it means.
GREEDY_TEMPERATURE_EPS = 1e-5


@dataclass
class SamplingParams:
    """Sampling and stopping rules of one request.

    Attributes:
        max_tokens: most tokens to generate (>= 1).
        temperature: 0 (or anything below ``GREEDY_TEMPERATURE_EPS``) = greedy (argmax); otherwise logits are
            divided by it before the filters below.
        top_p: keep the smallest set of most likely tokens whose probability sums to at least ``top_p``.
        top_k: keep the ``top_k`` most likely tokens (0 or -1 = off).
        min_p: drop tokens whose probability is below ``min_p`` times the most likely token's.
        seed: per-request seed; each token's random number is a hash of (seed, tokens sampled so far), so a
            seeded request samples the same tokens alone or batched with others. ``None``: a seed drawn from the
            engine's seed.
        stop: stop strings (matched across token boundaries; not included in the text unless
            ``include_stop_str_in_output``).
        stop_token_ids: token ids that end the request (their text is not included either).
        ignore_eos: keep going past the tokenizer's end-of-sequence token.
        logprobs: ``None`` = none; ``0`` = the chosen token's log-probability; ``N`` = also the top ``N``.
        include_stop_str_in_output: keep the matched stop string (or stop token's text) in the text.
        skip_special_tokens: leave special tokens out of the text.
        structured: a grammar the output must match (:class:`~dsa_runtime.engine.structured.StructuredOutput`:
            a JSON schema, any JSON object, a regex or an EBNF grammar); None: unconstrained.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    structured: StructuredOutput | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        problem = self._problem()
        if problem is not None:
            raise ValueError(f"SamplingParams: {problem}")

    def _problem(self) -> str | None:
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            return f"max_tokens must be an integer >= 1, got {self.max_tokens!r}"
        if not _is_number(self.temperature) or self.temperature < 0:
            return f"temperature must be a finite number >= 0, got {self.temperature!r}"
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            return f"top_p must be in (0, 1], got {self.top_p!r}"
        if not _is_int(self.top_k) or self.top_k < -1:
            return f"top_k must be an integer >= 0 (or -1 for off), got {self.top_k!r}"
        if not _is_number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            return f"min_p must be in [0, 1], got {self.min_p!r}"
        if self.seed is not None and not _is_int(self.seed):
            return f"seed must be an integer or None, got {self.seed!r}"
        if any(not isinstance(s, str) or not s for s in self.stop):
            return "stop must be a list of non-empty strings"
        if any(not _is_int(t) or t < 0 for t in self.stop_token_ids):
            return "stop_token_ids must be a list of integers >= 0"
        if self.logprobs is not None and (not _is_int(self.logprobs) or self.logprobs < 0):
            return f"logprobs must be None or an integer >= 0, got {self.logprobs!r}"
        if self.structured is not None and not isinstance(self.structured, StructuredOutput):
            return f"structured must be a StructuredOutput or None, got {type(self.structured).__name__}"
        return None

    @property
    def greedy(self) -> bool:
        """Argmax sampling: temperature 0 or so close to it that dividing the logits by it would overflow."""
        return self.temperature < GREEDY_TEMPERATURE_EPS


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
