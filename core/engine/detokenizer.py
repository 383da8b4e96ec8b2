"""Incremental detokenisation that never splits a UTF-8 character.

Byte-level tokenizers can cut one character across several tokens; decoding a token that ends mid-character
gives U+FFFD. The detokenizer decodes a small window of recent tokens (so a tokenizer that drops a leading
space when decoding from a word boundary still gets its context) and only releases text once the window no
longer ends in U+FFFD, holding back the bytes of an incomplete character. A character is at most 4 bytes and
every token carries at least one, so after ``MAX_HOLD`` held tokens the text is released as decoded
(the model really produced invalid UTF-8, which then shows as U+FFFD).

Tokenizers that expose each token's raw bytes (``token_bytes``, the loader's byte-level BPE wrapper) get
:class:`ByteDetokenizer` instead: an incremental UTF-8 decoder over the bytes, exact by construction.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any, Protocol

REPLACEMENT = "\ufffd"
MAX_HOLD = 4
# Prompt tokens decoded as left context for the first generated token.
CONTEXT_TOKENS = 5


class DecodesTokens(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str: ...


class IncrementalDetokenizer:
    """Turns a growing token list into text deltas.

    Args:
        tokenizer: anything with ``decode(ids, skip_special_tokens=...) -> str``.
        prompt_token_ids: the prompt (its last few tokens are used as left context only).
        skip_special_tokens: passed to ``decode``.
    """

    def __init__(
        self, tokenizer: DecodesTokens, prompt_token_ids: Sequence[int], skip_special_tokens: bool = True
    ) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = list(prompt_token_ids[-CONTEXT_TOKENS:])
        self._prefix = 0  # start of the decode window
        self._read = len(self._ids)  # tokens before this index are already released as text

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip) if ids else ""

    def add(self, token_id: int) -> str:
        """Append one token; return the newly complete text (possibly empty)."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        held = len(self._ids) - self._read
        if full_text.endswith(REPLACEMENT) and held < MAX_HOLD:
            return ""
        delta = self._delta(prefix_text, full_text)
        self._prefix, self._read = self._read, len(self._ids)
        return delta

    def flush(self) -> str:
        """Release held-back bytes at the end of the request (an incomplete character shows as U+FFFD)."""
        if self._read >= len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        delta = self._delta(prefix_text, full_text)
        self._prefix = self._read = len(self._ids)
        return delta

    def _delta(self, prefix_text: str, full_text: str) -> str:
        if full_text.startswith(prefix_text):
            return full_text[len(prefix_text) :]
        # The window's decode changed its already-released prefix (a tokenizer merging across the
        # boundary): never re-emit or retract text; decode the unread tokens on their own.
        return self._decode(self._ids[self._read :])


class ByteDetokenizer:
    """Exact incremental detokenizer for tokenizers that expose each token's bytes (``token_bytes(id)``).

    Bytes go through an incremental UTF-8 decoder: an incomplete character stays buffered until its last
    byte arrives; bytes that can never form a character become U+FFFD at once. Special tokens (``special_ids``)
    are dropped when ``skip_special_tokens``.
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = frozenset(tokenizer.special_ids) if skip_special_tokens else frozenset()
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_id: int) -> str:
        if token_id in self._skip:
            return ""
        return self._utf8.decode(self._tok.token_bytes(token_id))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


def make_detokenizer(
    tokenizer: Any, prompt_token_ids: Sequence[int], skip_special_tokens: bool = True
) -> IncrementalDetokenizer | ByteDetokenizer:
    """The byte-exact detokenizer when the tokenizer gives token bytes, else the decode-window one."""
    if callable(getattr(tokenizer, "token_bytes", None)):
        return ByteDetokenizer(tokenizer, skip_special_tokens)
    return IncrementalDetokenizer(tokenizer, prompt_token_ids, skip_special_tokens)
