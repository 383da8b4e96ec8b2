"""Render conversations in the V3.2 encoding and turn them into token ids with a loss mask.

The text is exactly what :func:`dsa_runtime.parsers.encode_messages` writes for the whole conversation;
the assistant spans are found by rendering each prefix (the prompt the server would send at that point,
ending in the ``<think>`` / ``</think>`` opener) and the conversation up to that assistant turn. Only
tokens that start inside an assistant span are trained on (the loss mask).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from train.tinychat.dialogs import Conversation, sample
from train.tinychat.json_answers import sample_json

TRAIN_SEED = 1234
HELDOUT_SEED = 98765


@dataclass
class Rendered:
    text: str
    spans: list[tuple[int, int]]  # character spans of the assistant turns (what the model writes)


def render(conv: Conversation) -> Rendered:
    """The full conversation text and the character spans of its assistant turns."""
    from dsa_runtime.parsers import encode_messages

    msgs = conv.messages
    full = encode_messages(msgs, conv.mode, tools=conv.tools, add_generation_prompt=False)
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        prompt = encode_messages(msgs[:i], conv.mode, tools=conv.tools)
        upto = encode_messages(msgs[: i + 1], conv.mode, tools=conv.tools, add_generation_prompt=False)
        if not (full.startswith(prompt) and full.startswith(upto) and len(upto) > len(prompt)):
            raise ValueError(f"conversation prefix mismatch at message {i}")
        spans.append((len(prompt), len(upto)))
    return Rendered(full, spans)


def conversations(n: int, *, heldout: bool, seed: int | None = None, invent: float = 0.0,
                  json_share: float = 0.0) -> Iterator[Conversation]:
    """``n`` conversations of the training mixture (or of the held-out split), deterministic per seed;
    ``invent``: share of entity slots filled with invented words (training only); ``json_share``: share of
    JSON-answer conversations (:mod:`~train.tinychat.json_answers`) in place of the mixture's. With
    ``json_share`` 0 the stream is the mixture's alone (the tokenizer is trained on it)."""
    rng = random.Random(seed if seed is not None else (HELDOUT_SEED if heldout else TRAIN_SEED))
    for _ in range(n):
        if json_share > 0 and rng.random() < json_share:
            yield sample_json(rng, heldout, invent=invent)
        else:
            yield sample(rng, heldout, invent=invent)


def tokenize(tokenizer, rendered: Rendered) -> tuple[list[int], list[int]]:
    """Ids of the text (no extra BOS: the encoder wrote it) and a 0/1 mask of the tokens to learn.

    ``tokenizer`` is a ``tokenizers.Tokenizer``.
    """
    enc = tokenizer.encode(rendered.text, add_special_tokens=False)
    mask = []
    for start, _end in enc.offsets:
        mask.append(int(any(a <= start < b for a, b in rendered.spans)))
    return list(enc.ids), mask
