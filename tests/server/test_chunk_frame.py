"""The chat stream's pre-serialised chunk framing gives the JSON that building and dumping each chunk gives."""

from __future__ import annotations

import json
import random

from tests.server.needs import server_extra

server_extra()

from dsa_runtime.server.serving_chat import ChunkFrame  # noqa: E402

_ALPHABET = 'ab "\\\n\t\x00\x1féあ😀<｜DSML｜>{}'


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(_ALPHABET) for _ in range(rng.randrange(0, 12)))


def _reference(chunk_id, created, model, include_usage, j, delta, reason, logprobs) -> str:
    payload = {"id": chunk_id, "object": "chat.completion.chunk", "created": created, "model": model,
               "choices": [{"index": j, "delta": delta, "logprobs": logprobs, "finish_reason": reason}]}
    if include_usage:
        payload["usage"] = None
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def test_frame_matches_dumping_the_whole_chunk_on_random_fields():
    rng = random.Random(0)
    for _ in range(300):
        chunk_id, created, model = f"chatcmpl-{_text(rng)}", rng.randrange(2**40), _text(rng)
        include_usage = rng.random() < 0.5
        frame = ChunkFrame(chunk_id, created, model, include_usage)
        delta = rng.choice([
            {}, {"role": "assistant", "content": ""}, {"content": _text(rng)}, {"reasoning_content": _text(rng)},
            {"tool_calls": [{"index": rng.randrange(4), "function": {"arguments": _text(rng)}}]},
        ])
        reason = rng.choice([None, "stop", "length", "tool_calls"])
        logprobs = rng.choice([None, {"content": [{"token": _text(rng), "logprob": -rng.random(), "bytes": [1, 2],
                                                   "top_logprobs": []}]}])
        j = rng.randrange(16)
        got = frame.chunk(j, delta, reason, logprobs)
        assert got == _reference(chunk_id, created, model, include_usage, j, delta, reason, logprobs)
        assert json.loads(got[len("data: "):])["choices"][0]["delta"] == delta
