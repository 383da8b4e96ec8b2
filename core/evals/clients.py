"""One chat turn, asked of an OpenAI-compatible server (:class:`HTTPClient`) or of an engine built in this
process (:class:`InProcessClient`: the server's engine API -- :class:`AsyncEngine` over :class:`Engine`, the
same chat encoding and output parsers -- with no port).

Both return a :class:`Reply`. A question the endpoint refuses (a 4xx such as a prompt past the context, a
5xx) raises :class:`RequestFailed` and is scored as invalid; an endpoint that cannot serve at all (not
reachable, bad key, unknown model) raises :class:`~dsa_runtime.errors.ConfigError`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsa_runtime.errors import ConfigError


@dataclass(frozen=True)
class Sampling:
    """Per-request settings (OpenAI's names)."""

    max_tokens: int
    temperature: float
    seed: int | None = None
    thinking: bool = False


@dataclass(frozen=True)
class Reply:
    """A parsed assistant turn: ``content`` without the reasoning, ``tool_calls`` as ``(name, arguments
    JSON)``, and the request's token counts."""

    content: str | None
    tool_calls: list[tuple[str, str]]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


class RequestFailed(Exception):
    """The endpoint answered one request with an error (the message says which)."""


class HTTPClient:
    """``AsyncOpenAI`` against ``base_url``; ``model`` None: the first model the endpoint lists."""

    def __init__(self, base_url: str, api_key: str | None, model: str | None, timeout_s: float = 600.0) -> None:
        try:
            import openai
        except ImportError:
            raise ConfigError(
                "eval against a server needs the openai client: pip install 'dsa-runtime[eval]' (or use --in-process)"
            ) from None
        self._openai = openai
        self._client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key or "EMPTY", timeout=timeout_s)
        self.base_url = base_url
        self.model = model

    async def start(self) -> None:
        """Check the endpoint answers (and pick the model when none was given)."""
        try:
            listed = [m.id async for m in self._client.models.list()]
        except self._openai.APIError as exc:
            raise self._fatal(exc) from None
        if self.model is None:
            if not listed:
                raise ConfigError(f"{self.base_url}/models lists no model; pass --model")
            self.model = listed[0]

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, sampling: Sampling) -> Reply:
        extra: dict[str, Any] = {}
        if tools:
            extra["tools"] = tools
        if sampling.seed is not None:
            extra["seed"] = sampling.seed
        if sampling.thinking:
            extra["extra_body"] = {"chat_template_kwargs": {"thinking": True}}
        try:
            response = await self._client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=sampling.max_tokens,
                temperature=sampling.temperature, **extra,
            )  # fmt: skip
        except (self._openai.APIConnectionError, self._openai.AuthenticationError, self._openai.NotFoundError,
                self._openai.PermissionDeniedError) as exc:  # fmt: skip
            raise self._fatal(exc) from None
        except self._openai.APIError as exc:
            raise RequestFailed(self._message(exc)) from None
        choice = response.choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        usage = response.usage
        return Reply(choice.message.content, calls, usage.prompt_tokens if usage else 0,
                     usage.completion_tokens if usage else 0, choice.finish_reason or "")  # fmt: skip

    async def close(self) -> None:
        await self._client.close()

    def _fatal(self, exc: Exception) -> ConfigError:
        if isinstance(exc, self._openai.APIConnectionError):
            return ConfigError(f"cannot reach {self.base_url} ({exc}); start a server (dsa-runtime serve) or use --in-process")
        return ConfigError(f"{self.base_url}: {self._message(exc)}")

    def _message(self, exc: Exception) -> str:
        """The server's own error message (its OpenAI error object), else the exception text."""
        if isinstance(exc, self._openai.APIStatusError) and isinstance(exc.body, dict):
            message = exc.body.get("message")
            if isinstance(message, str):
                return f"{exc.status_code}: {message}"
        return str(exc)


class InProcessClient:
    """The engine of ``config`` (an :class:`EngineConfig`) in this process, driven like the server drives it."""

    def __init__(self, config: Any) -> None:
        from dsa_runtime.engine.async_engine import AsyncEngine
        from dsa_runtime.engine.chat import chat_format
        from dsa_runtime.engine.engine import Engine

        engine = Engine(config)
        path = engine.model_path
        self._format = chat_format(engine.model_config, path)
        self._tokenizer = engine.tokenizer
        self._engine = AsyncEngine(engine)
        self._ids = itertools.count()
        self.model = Path(path).name if path else "dsa-runtime-default"

    async def start(self) -> None:
        self._engine.start()

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, sampling: Sampling) -> Reply:
        from dsa_runtime.engine.chat import parse_completion, prepare_chat
        from dsa_runtime.engine.params import SamplingParams

        text, choice, thinking = prepare_chat(self._format, messages, tools, sampling.thinking)
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        params = SamplingParams(max_tokens=sampling.max_tokens, temperature=sampling.temperature, seed=sampling.seed)
        final = None
        try:
            async for out in self._engine.generate(ids, params, f"eval-{next(self._ids)}"):
                final = out
        except ValueError as exc:  # the engine's refusal of this prompt (e.g. longer than the context)
            raise RequestFailed(str(exc)) from None
        result = parse_completion(self._format, text, final, thinking, choice.forced, choice.parse_calls)
        calls = [(c.name, c.arguments) for c in result.tool_calls]
        return Reply(result.content, calls, len(final.prompt_token_ids), len(final.token_ids), result.finish_reason)

    async def close(self) -> None:
        await self._engine.shutdown()
