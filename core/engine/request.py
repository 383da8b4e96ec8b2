"""One request's state inside the engine: tokens, cache progress, pages, text and finish state."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from dsa_runtime.engine.detokenizer import ByteDetokenizer, IncrementalDetokenizer
from dsa_runtime.engine.outputs import RequestMetrics, RequestOutput, TokenLogprob
from dsa_runtime.engine.params import SamplingParams
from dsa_runtime.engine.stop import held_back
from dsa_runtime.engine.structured import GrammarState


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """Mutable state of one request.

    ``token_ids`` is prompt + generated tokens; ``num_computed`` of them are in the KV cache (the rest are
    fed in the next forward). ``pages`` are the physical cache pages covering positions ``0 ..
    len(pages) * page_size - 1``. ``text`` is the generated text so far (cut at a stop string when one
    matched); ``emitted_chars`` / ``emitted_tokens`` / ``emitted_logprobs`` say how much was already reported.
    ``seed`` keys the request's random stream: its ``n``-th sampled token uses the uniform number
    ``hash(seed, n)`` (:func:`dsa_runtime.engine.sampler.uniforms`), so a recomputed request continues unchanged.
    """

    request_id: str
    prompt_len: int
    token_ids: list[int]
    params: SamplingParams
    seed: int
    detokenizer: IncrementalDetokenizer | ByteDetokenizer
    metrics: RequestMetrics
    status: Status = Status.WAITING
    num_computed: int = 0
    pages: list[int] = field(default_factory=list)
    text: str = ""
    emitted_chars: int = 0
    emitted_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    emitted_logprobs: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    num_preemptions: int = 0
    slot: int = -1  # the runner's request slot (GPU-resident block table row) while decoding; -1: none
    inflight: int = 0  # tokens sampled on the device whose value the host has not read yet (overlap scheduling)
    cache_nodes: list = field(default_factory=list)  # prefix-cache nodes this request references
    num_cached_tokens: int = 0  # prompt tokens taken from the prefix cache at admission (not computed)
    grammar: GrammarState | None = None  # the matcher of a structured-output request
    # MTP speculation: whether its slot holds a first draft token and chain state (set by a draft extend,
    # cleared when the slot is released).
    draft_ready: bool = False

    @property
    def prompt_token_ids(self) -> list[int]:
        # One copy shared by every output of this request (outputs are read-only by convention).
        cached = self.__dict__.get("_prompt")
        if cached is None:
            cached = self.__dict__["_prompt"] = self.token_ids[: self.prompt_len]
        return cached

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) + self.inflight - self.num_computed

    @property
    def is_decoding(self) -> bool:
        """Only the last sampled token is missing from the cache."""
        return self.num_uncomputed == 1 and self.num_output_tokens > 0

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def take_output(self) -> RequestOutput:
        """This step's output: the deltas since the last one (text only up to where no stop string can still
        begin), and the counters moved past them."""
        end = len(self.text)
        if not self.finished:
            end -= held_back(self.text, self.params.stop)
        end = max(end, self.emitted_chars)
        new_text = self.text[self.emitted_chars : end]
        self.emitted_chars = end
        outputs = self.output_token_ids
        new_ids = outputs[self.emitted_tokens :]
        self.emitted_tokens = len(outputs)
        new_logprobs = self.logprobs[self.emitted_logprobs :]
        self.emitted_logprobs = len(self.logprobs)
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=self.prompt_token_ids,
            token_ids=outputs,
            text=self.text[:end],
            new_token_ids=new_ids,
            new_text=new_text,
            finished=self.finished,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            logprobs=new_logprobs,
            metrics=self.metrics,
            num_cached_tokens=self.num_cached_tokens,
        )
