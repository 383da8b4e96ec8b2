"""``POST /v1/completions``: raw prompts (text or token ids, one or several) with OpenAI's legacy shapes."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from dsa_runtime.server.errors import APIError, bad_request, server_error, unavailable
from dsa_runtime.server.logprobs import completion_logprobs
from dsa_runtime.server.protocol import CompletionRequest, parse_body
from dsa_runtime.server.serving_chat import merge
from dsa_runtime.server.state import (
    ServerState,
    check_n,
    generate,
    new_id,
    resolve_max_tokens,
    sampling_params,
)
from dsa_runtime.server.structured import structured_output_of

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions


class CompletionRun:
    """One validated completion request: ``len(prompts) * n`` choices, index = prompt * n + j."""

    def __init__(self, state: ServerState, body: Any) -> None:
        req = parse_body(CompletionRequest, body)
        state.check_model(req.model)
        check_n(req.n)
        if req.suffix:
            raise bad_request("suffix is not supported", param="suffix")
        self.state, self.req = state, req
        self.id, self.created = new_id("cmpl"), int(time.time())
        self.arrival = time.monotonic()
        self.cached_tokens: dict[int, int] = {}  # job -> prompt tokens its request found in the prefix cache
        self.prompts = self._prompts(req.prompt)
        if len(self.prompts) * req.n > 64:
            raise bad_request("too many choices: prompts x n must be at most 64", param="n")
        if req.logprobs is not None and not 0 <= req.logprobs <= 20:
            raise bad_request(f"logprobs must be between 0 and 20, got {req.logprobs}", param="logprobs")
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        self.jobs: list[tuple[list[int], Any]] = []
        structured = structured_output_of(req)
        for ids in self.prompts:
            max_tokens = resolve_max_tokens(state, req.max_tokens, len(ids), DEFAULT_MAX_TOKENS, "prompt")
            for j in range(req.n):
                self.jobs.append((ids, sampling_params(
                    max_tokens=max_tokens,
                    temperature=1.0 if req.temperature is None else float(req.temperature),
                    top_p=1.0 if req.top_p is None else float(req.top_p),
                    top_k=req.top_k or 0,
                    min_p=0.0 if req.min_p is None else float(req.min_p),
                    seed=None if req.seed is None else req.seed + j,
                    stop=stop,
                    stop_token_ids=list(req.stop_token_ids or []),
                    ignore_eos=req.ignore_eos,
                    logprobs=req.logprobs,
                    include_stop_str_in_output=req.include_stop_str_in_output,
                    skip_special_tokens=req.skip_special_tokens,
                    structured=structured,
                )))

    def _prompts(self, prompt: Any) -> list[list[int]]:
        state = self.state
        vocab = state.tokenizer.vocab_size
        if isinstance(prompt, str):
            prompt = [prompt]
        if prompt and all(isinstance(p, int) for p in prompt):
            prompt = [prompt]
        out = []
        for p in prompt:
            ids = state.prompts.encode(p, max_len=state.max_model_len, param="prompt") if isinstance(p, str) else list(p)
            if not ids:
                raise bad_request("prompt must not be empty", param="prompt")
            if any(not 0 <= t < vocab for t in ids):
                raise bad_request(f"prompt token ids must be in [0, {vocab})", param="prompt")
            out.append(ids)
        if not out:
            raise bad_request("prompt must not be empty", param="prompt")
        return out

    def _echo(self, index: int) -> str:
        if not self.req.echo:
            return ""
        return self.state.tokenizer.decode(self.jobs[index][0], skip_special_tokens=False)

    def outputs(self) -> AsyncIterator[tuple[int, Any]]:
        return merge([
            generate(self.state, ids, params, f"{self.id}-{k}", self.arrival) for k, (ids, params) in enumerate(self.jobs)
        ])

    def usage(self, completion_tokens: int) -> dict[str, Any]:
        prompt = sum(len(ids) for ids, _ in self.jobs[:: self.req.n])
        # Each prompt counted once (its n choices share it), with the most any of its choices found cached.
        cached: dict[int, int] = {}
        for k, n in self.cached_tokens.items():
            cached[k // self.req.n] = max(cached.get(k // self.req.n, 0), n)
        return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                "total_tokens": prompt + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": sum(cached.values())}}

    async def response(self) -> dict[str, Any]:
        texts = [self._echo(k) for k in range(len(self.jobs))]
        logprobs: list[list[Any]] = [[] for _ in self.jobs]
        choices: list[Any] = [None] * len(self.jobs)
        completion_tokens = 0
        async for k, out in self.outputs():
            logprobs[k] += out.logprobs or []
            if out.finished:
                if out.finish_reason == "abort":
                    raise unavailable("the request was aborted (server shutting down)")
                completion_tokens += len(out.token_ids)
                self.cached_tokens[k] = out.num_cached_tokens
                lp = None
                if self.req.logprobs is not None:
                    lp = completion_logprobs(self.state.tokenizer, logprobs[k], len(texts[k]))
                choices[k] = {"index": k, "text": texts[k] + out.text, "logprobs": lp,
                              "finish_reason": out.finish_reason}
        return {"id": self.id, "object": "text_completion", "created": self.created,
                "model": self.state.model_name, "choices": choices, "usage": self.usage(completion_tokens)}

    async def sse(self) -> AsyncIterator[str]:
        include_usage = bool(self.req.stream_options and self.req.stream_options.include_usage)
        completion_tokens = 0
        sent = [0] * len(self.jobs)
        try:
            for k in range(len(self.jobs)):
                echo = self._echo(k)
                if echo:
                    sent[k] = len(echo)
                    yield self._chunk(k, echo, None, None, include_usage)
            async for k, out in self.outputs():
                if out.finished and out.finish_reason == "abort":
                    raise unavailable("the request was aborted (server shutting down)")
                lp = None
                if self.req.logprobs is not None and out.logprobs:
                    lp = completion_logprobs(self.state.tokenizer, out.logprobs, sent[k])
                sent[k] += len(out.new_text)
                if out.new_text or lp is not None or out.finished:
                    reason = out.finish_reason if out.finished else None
                    yield self._chunk(k, out.new_text, lp, reason, include_usage)
                if out.finished:
                    completion_tokens += len(out.token_ids)
                    self.cached_tokens[k] = out.num_cached_tokens
            if include_usage:
                yield _event({"id": self.id, "object": "text_completion", "created": self.created,
                              "model": self.state.model_name, "choices": [], "usage": self.usage(completion_tokens)})
        except APIError as exc:
            yield exc.sse()
        except Exception:  # noqa: BLE001 - end the stream with an error event
            logger.exception("completion stream %s failed", self.id)
            yield server_error("internal error while generating").sse()
        yield "data: [DONE]\n\n"

    def _chunk(self, k: int, text: str, lp: Any, reason: str | None, include_usage: bool) -> str:
        chunk: dict[str, Any] = {
            "id": self.id, "object": "text_completion", "created": self.created, "model": self.state.model_name,
            "choices": [{"index": k, "text": text, "logprobs": lp, "finish_reason": reason}],
        }
        if include_usage:
            chunk["usage"] = None
        return _event(chunk)


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
