"""Engine ``TokenLogprob`` lists -> the OpenAI ``logprobs`` objects of chat and text completions."""

from __future__ import annotations

from typing import Any


def _token(tokenizer: Any, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _finite(value: float) -> float:
    # JSON has no -inf; OpenAI clients expect a number. -9999.0 is what OpenAI itself sends for "impossible".
    return value if value > -9999.0 else -9999.0


def chat_logprobs(tokenizer: Any, items: list[Any]) -> dict[str, Any]:
    """``{"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}`` (chat completions)."""
    content = []
    for item in items:
        text = _token(tokenizer, item.token_id)
        content.append(
            {
                "token": text,
                "logprob": _finite(float(item.logprob)),
                "bytes": list(text.encode("utf-8")),
                "top_logprobs": [
                    {
                        "token": (t := _token(tokenizer, tid)),
                        "logprob": _finite(float(lp)),
                        "bytes": list(t.encode("utf-8")),
                    }
                    for tid, lp in item.top
                ],
            }
        )
    return {"content": content}


def completion_logprobs(tokenizer: Any, items: list[Any], offset: int) -> dict[str, Any]:
    """``{tokens, token_logprobs, top_logprobs, text_offset}`` (legacy completions); ``offset`` = text so far."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for item in items:
        text = _token(tokenizer, item.token_id)
        tokens.append(text)
        token_logprobs.append(_finite(float(item.logprob)))
        tops.append({_token(tokenizer, tid): _finite(float(lp)) for tid, lp in item.top} or None)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}
