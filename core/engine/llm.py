"""``LLM``: the offline API (``dsa_runtime.LLM``) over one synchronous :class:`Engine`.

>>> from dsa_runtime import LLM, SamplingParams                                   # doctest: +SKIP
>>> llm = LLM()                      # the embedded tiny V3.2 model                 # doctest: +SKIP
>>> llm.generate("Hello", SamplingParams(max_tokens=16))[0].text                  # doctest: +SKIP
>>> llm.chat([{"role": "user", "content": "Hi"}], thinking=True).reasoning_content  # doctest: +SKIP
>>> llm.score(llm.tokenizer.encode("Hello world")).shape    # [len, vocab] float32  # doctest: +SKIP
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from dsa_runtime.engine.chat import (
    ChatFormat,
    ChatResult,
    chat_format,
    output_parser,
    parse_completion,
    prepare_chat,
)
from dsa_runtime.engine.config import EngineConfig
from dsa_runtime.engine.engine import Engine
from dsa_runtime.engine.outputs import RequestOutput
from dsa_runtime.engine.params import SamplingParams

Prompt = str | Sequence[int]


class LLM:
    """Load a model (``model=None``: the embedded tiny V3.2 checkpoint) and generate, chat or score.

    Args:
        model: checkpoint directory or None.
        dtype: ``"bfloat16"`` or ``"float32"``.
        engine: an existing engine to wrap instead (tests, custom parts); ``model``/``config`` are then unused.
        **config: any other :class:`EngineConfig` field (``max_total_tokens=...``, ``kv_cache_dtype=...``).
    """

    def __init__(
        self,
        model: str | None = None,
        dtype: str = "bfloat16",
        *,
        engine: Engine | None = None,
        **config: Any,
    ) -> None:
        self.engine = engine or Engine(EngineConfig(model=model, dtype=dtype, **config))
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()
        self._chat_format: ChatFormat | None = None

    # --- generation -----------------------------------------------------------------------------
    def generate(
        self,
        prompts: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion, batched; final outputs in prompt order.

        ``prompts``: one text, a list of texts, one token-id list or a list of them. Texts are tokenized with
        the BOS token prepended. ``sampling_params``: one for all, or one per prompt.
        """
        token_lists = self._token_lists(prompts)
        params = self._params(sampling_params, len(token_lists))
        ids = [self._add(tokens, p) for tokens, p in zip(token_lists, params, strict=True)]
        final: dict[str, RequestOutput] = {}
        try:
            while len(final) < len(ids):
                for out in self.engine.step():
                    if out.finished:
                        final[out.request_id] = out
        finally:
            for rid in ids:
                if rid not in final:
                    self.engine.abort(rid)
            self._drain()
        return [final[rid] for rid in ids]

    def stream(
        self, prompt: Prompt, sampling_params: SamplingParams | None = None
    ) -> Iterator[RequestOutput]:
        """Yield one request's outputs as they come (``new_text`` deltas); the last one is ``finished``.

        Closing the iterator early aborts the request.
        """
        (tokens,) = self._token_lists(prompt)
        rid = self._add(tokens, sampling_params or SamplingParams())
        done = False
        try:
            while not done:
                for out in self.engine.step():
                    if out.request_id == rid:
                        done = out.finished
                        yield out
        finally:
            if not done:
                self.engine.abort(rid)
                self._drain()

    # --- chat -----------------------------------------------------------------------------------
    @property
    def chat_format(self) -> ChatFormat:
        if self._chat_format is None:
            path = self.engine.model_path
            self._chat_format = chat_format(self.engine.model_config, path)
        return self._chat_format

    def chat_prompt(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
        thinking: bool = False, tool_choice: Any = None,
    ) -> tuple[str, list[int]]:  # fmt: skip
        """The prompt text and token ids of a conversation (V3.2 encoding or the model's chat template).

        A ``required`` / named ``tool_choice`` ends it with the forced opening of a tool call (see :meth:`chat`).
        """
        text, _, _ = prepare_chat(self.chat_format, messages, tools, thinking, tool_choice)
        return text, self.tokenizer.encode(text, add_special_tokens=False)

    def chat_parser(self, thinking: bool = False) -> Any:
        """A fresh :class:`dsa_runtime.parsers.OutputParser` (``.stream()`` for incremental deltas)."""
        return output_parser(self.chat_format, thinking)

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        thinking: bool = False,
        sampling_params: SamplingParams | None = None,
        tool_choice: Any = None,
    ) -> ChatResult:
        """One assistant turn: encode, generate, then split reasoning, content and tool calls.

        ``tool_choice`` is OpenAI's (default ``auto`` with tools, else ``none``): ``none`` hides the tools and
        parses no calls; ``required`` / ``{"type": "function", "function": {"name": NAME}}`` make the reply
        open a tool call (of NAME) in the model's own format, with thinking off, exactly as the server does
        (:mod:`dsa_runtime.parsers.tool_choice`). Raises ``ToolChoiceError`` for a bad choice.
        """
        text, choice, thinking = prepare_chat(self.chat_format, messages, tools, thinking, tool_choice)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        (output,) = self.generate([ids], sampling_params)
        return parse_completion(self.chat_format, text, output, thinking, choice.forced, choice.parse_calls)

    # --- scoring --------------------------------------------------------------------------------
    def score(self, token_ids: Sequence[int]) -> Any:
        """float32 ``[len, vocab]`` logits for every position of one sequence (see :meth:`Engine.score`)."""
        return self.engine.score(list(token_ids))

    # --- helpers --------------------------------------------------------------------------------
    def _add(self, tokens: list[int], params: SamplingParams) -> str:
        rid = f"llm-{next(self._ids)}"
        self.engine.add_request(rid, tokens, params)
        return rid

    def _drain(self) -> None:
        """Deliver pending abort outputs so the engine is idle for the next call."""
        while self.engine.has_unfinished() and not self.engine.scheduler.has_work():
            self.engine.step()

    def _token_lists(self, prompts: Any) -> list[list[int]]:
        if isinstance(prompts, str):
            prompts = [prompts]
        if not isinstance(prompts, Sequence) or len(prompts) == 0:
            raise ValueError("prompts must be a text, a list of texts, a token-id list or a list of them")
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompts):
            return [list(prompts)]
        out: list[list[int]] = []
        for p in prompts:
            if isinstance(p, str):
                out.append(self.tokenizer.encode(p, add_special_tokens=True))
            elif isinstance(p, Sequence) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
                out.append(list(p))
            else:
                raise ValueError(
                    f"prompt {len(out)}: expected a text or a list of token ids, got {type(p).__name__}"
                )
        return out

    @staticmethod
    def _params(params: SamplingParams | Sequence[SamplingParams] | None, n: int) -> list[SamplingParams]:
        if params is None:
            return [SamplingParams()] * n
        if isinstance(params, SamplingParams):
            return [params] * n
        if len(params) != n:
            raise ValueError(f"{len(params)} sampling params for {n} prompts")
        return list(params)
