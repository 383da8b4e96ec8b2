"""Tokenizer wrapper over a ``tokenizer.json`` (Hugging Face ``tokenizers``), the engine's only tokenizer API.

Special-token ids are always looked up by string (``tokenizer_config.json``'s ``bos_token`` / ``eos_token``,
else DeepSeek's strings); no id is hard-coded. Byte-level BPE means :meth:`Tokenizer.decode` round-trips any
UTF-8 text, and :meth:`Tokenizer.token_bytes` gives each token's raw bytes for incremental detokenization
(a token may hold only part of a multi-byte character).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from dsa_runtime.loader.errors import LoadError
from dsa_runtime.loader.tokenizer_train import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN


@lru_cache(maxsize=1)
def byte_level_decoder() -> dict[str, int]:
    """Char -> byte of the byte-level alphabet: printable bytes stand for themselves, the other 68 bytes are
    mapped, in order, onto the code points from U+0100 up (the GPT-2 convention ``tokenizers`` uses)."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    table: dict[str, int] = {}
    shifted = 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(0x100 + shifted)] = b
            shifted += 1
    return table


def _token_string(entry: Any) -> str | None:
    """``tokenizer_config.json`` writes a token as a string or as ``{"content": ...}``."""
    if isinstance(entry, dict):
        entry = entry.get("content")
    return entry if isinstance(entry, str) else None


class Tokenizer:
    """Encode / decode with DeepSeek's special tokens; wraps a ``tokenizers.Tokenizer``.

    Attributes:
        vocab_size: number of ids (added tokens included).
        bos_id, eos_id: ids of the ``bos_token`` / ``eos_token`` strings; ``pad_id`` may be None.
        special_ids: ids hidden by ``skip_special_tokens`` (``<think>`` and tool markers are not among them).
    """

    def __init__(self, backend: Any, *, bos_token: str = BOS_TOKEN, eos_token: str = EOS_TOKEN,
                 pad_token: str | None = PAD_TOKEN, source: str = "tokenizer.json") -> None:
        from tokenizers import decoders

        self.backend = backend
        self.source = source
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.bos_id = self._require(bos_token, "bos_token")
        self.eos_id = self._require(eos_token, "eos_token")
        self.pad_id = backend.token_to_id(pad_token) if pad_token else None
        added = backend.get_added_tokens_decoder()
        self.special_ids: frozenset[int] = frozenset(i for i, t in added.items() if t.special)
        self.added_tokens: dict[str, int] = {t.content: i for i, t in added.items()}
        self._added_bytes = {i: t.content.encode("utf-8") for i, t in added.items()}
        self._byte_level = isinstance(backend.decoder, decoders.ByteLevel)

    def _require(self, token: str, what: str) -> int:
        tid = self.backend.token_to_id(token)
        if tid is None:
            raise LoadError(f"{self.source}: {what} {token!r} is not in the vocabulary")
        return tid

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; special-token strings in ``text`` become their ids.
        ``add_special_tokens=True`` prepends ``bos_id`` (DeepSeek adds no eos)."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if add_special_tokens else list(ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; an incomplete UTF-8 sequence at the end decodes to U+FFFD."""
        self._check(ids)
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token (UTF-8 of an added token); concatenation over ids gives the text's bytes."""
        self._check((token_id,))
        if token_id in self._added_bytes:
            return self._added_bytes[token_id]
        piece = self.backend.id_to_token(token_id)
        if self._byte_level:
            table = byte_level_decoder()
            return bytes(table[c] for c in piece)
        return self.backend.decode([token_id]).encode("utf-8")

    def convert_ids_to_bytes(self, ids: Iterable[int], skip_special_tokens: bool = False) -> bytes:
        """Concatenated :meth:`token_bytes`, optionally without the special tokens."""
        return b"".join(self.token_bytes(i) for i in ids if not (skip_special_tokens and i in self.special_ids))

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def _check(self, ids: Iterable[int]) -> None:
        for i in ids:
            if not 0 <= int(i) < self.vocab_size:
                raise ValueError(f"token id {i} is outside the vocabulary (0..{self.vocab_size - 1})")

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, bos_id={self.bos_id}, eos_id={self.eos_id})"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise LoadError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LoadError(f"{path}: cannot read: {exc}") from None


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load ``tokenizer.json`` from a checkpoint folder (or the file itself) with its ``tokenizer_config.json``."""
    from tokenizers import Tokenizer as Backend

    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise LoadError(f"{file}: no tokenizer.json")
    _read_json(file)  # a clear error for bad JSON before the Rust parser's message
    try:
        backend = Backend.from_file(str(file))
    except Exception as exc:  # tokenizers raises a bare Exception for malformed files
        raise LoadError(f"{file}: not a valid tokenizer.json: {str(exc).splitlines()[0]}") from None
    tokens = {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN}
    cfg_file = file.parent / "tokenizer_config.json"
    if cfg_file.is_file():
        cfg = _read_json(cfg_file)
        for key in tokens:
            value = _token_string(cfg.get(key)) if isinstance(cfg, dict) else None
            tokens[key] = value or tokens[key]
    return Tokenizer(backend, source=str(file), **tokens)
