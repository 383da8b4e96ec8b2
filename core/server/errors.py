"""OpenAI error objects: ``{"error": {"message", "type", "param", "code"}}`` with the HTTP status on the response.

``code`` is OpenAI's string code or ``None`` (never the integer status, which vLLM puts there).
"""

from __future__ import annotations

import json
from typing import Any


class APIError(Exception):
    """An error answered to the client as an OpenAI error object."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",  # noqa: A002 - OpenAI's field name
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def sse(self) -> str:
        """The error as one server-sent event (mid-stream failures)."""
        return f"data: {json.dumps(self.body(), ensure_ascii=False)}\n\n"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(message, status=400, param=param, code=code)


def context_exceeded(max_model_len: int, prompt_len: int, param: str) -> APIError:
    """The prompt alone fills the context: no room for even one output token."""
    return bad_request(
        f"This model's maximum context length is {max_model_len} tokens; the prompt has {prompt_len} tokens, "
        "leaving no room for output",
        param=param, code="context_length_exceeded",
    )


def server_error(message: str) -> APIError:
    return APIError(message, status=500, type="server_error", code="internal_error")


def unavailable(message: str) -> APIError:
    return APIError(message, status=503, type="server_error", code="service_unavailable")
