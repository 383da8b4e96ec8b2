"""Test doubles of the engine's collaborators: a byte-level tokenizer and a paged toy model runner.

``FakeRunner`` keeps a real paged "cache" (token ids per physical slot) and computes each sequence's logits
from the tokens it reads back through its page table, so a wrong page table, start position, chunk boundary
or a page shared by two requests changes the output; its logits are a deterministic function of the whole
prefix (a hash seeding a normal draw), so batching or chunking bugs show up as different tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from dsa_runtime.engine.parts import EngineParts

BOS, EOS, PAD = 0, 1, 2
SPECIALS = {BOS: "<bos>", EOS: "<eos>", PAD: "<pad>"}
BYTE0 = 3  # token BYTE0 + b is the single byte b
WORDS = ["Hello", " world", " the", "日本", "é", "STOP", "\n"]


class FakeTokenizer:
    """Byte-level tokenizer: 3 special tokens, 256 byte tokens, a few multi-byte words (some multi-char)."""

    def __init__(self) -> None:
        self.pieces: list[bytes] = [b""] * BYTE0 + [bytes([b]) for b in range(256)]
        self.pieces += [w.encode() for w in WORDS]
        self.vocab_size = len(self.pieces)
        self.bos_id, self.eos_id = BOS, EOS
        self.special_ids = set(SPECIALS)
        self.added_tokens: dict[str, int] = {}  # text -> id of tokens added past the base vocabulary: none

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        data = text.encode()
        ids: list[int] = [BOS] if add_special_tokens else []
        i = 0
        words = sorted(range(BYTE0 + 256, self.vocab_size), key=lambda t: -len(self.pieces[t]))
        while i < len(data):
            for t in words:
                piece = self.pieces[t]
                if data.startswith(piece, i):
                    ids.append(t)
                    i += len(piece)
                    break
            else:
                ids.append(BYTE0 + data[i])
                i += 1
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        out: list[str] = []
        buf = b""
        for t in ids:
            if t in SPECIALS:
                out.append(buf.decode("utf-8", errors="replace"))
                buf = b""
                if not skip_special_tokens:
                    out.append(SPECIALS[t])
            else:
                buf += self.pieces[t]
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)


class FakeByteTokenizer(FakeTokenizer):
    """The same vocabulary, also exposing ``token_bytes`` (the engine then uses the byte detokenizer)."""

    def token_bytes(self, token_id: int) -> bytes:
        return SPECIALS[token_id].encode() if token_id in SPECIALS else self.pieces[token_id]


def hash_logits(tokens: Sequence[int], vocab: int) -> torch.Tensor:
    """Deterministic float32 ``[vocab]`` logits from the whole prefix (order-sensitive)."""
    h = 1469598103934665603
    for t in tokens:
        h = ((h ^ (t + 1)) * 1099511628211) % (1 << 61)
    g = torch.Generator().manual_seed(h)
    return torch.randn(vocab, generator=g) * 3.0


class FakeAllocator:
    """Minimal page allocator (page 0 reserved), checking double frees."""

    def __init__(self, num_pages: int) -> None:
        self._free = list(range(num_pages - 1, 0, -1))
        self.used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self.used)

    def alloc(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        pages = [self._free.pop() for _ in range(n)]
        self.used.update(pages)
        return pages

    def free(self, pages: list[int]) -> None:
        for p in pages:
            assert p in self.used, f"page {p} freed twice"
            self.used.discard(p)
            self._free.append(p)


class FakeRunner:
    """Toy model over a paged token cache behind the Runner protocol; records each step for assertions.

    Its slot state is a host block table and each slot's last published token; a step writes every row's token
    at the cache slot its block table gives, then each picked row's logits are computed from the tokens it
    reads back (positions ``0 .. position``) through that table.

    Args:
        logit_fn: ``tokens -> float32 [vocab]`` (default :func:`hash_logits`).
    """

    device = torch.device("cpu")
    nextn = False
    graph_rows = 0

    def __init__(
        self,
        vocab: int,
        page_size: int,
        num_pages: int,
        logit_fn: Callable[[list[int]], torch.Tensor] | None = None,
        max_requests: int = 64,
    ) -> None:
        self.vocab, self.page_size, self.num_pages = vocab, page_size, num_pages
        self.max_requests = max_requests
        self.max_pages = num_pages
        self.stopped = False  # set by shutdown()
        self.table = [[0] * num_pages for _ in range(max_requests + 1)]
        self.last = [0] * (max_requests + 1)
        self.slots: list[int | None] = [None] * (num_pages * page_size)
        self.logit_fn = logit_fn or (lambda toks: hash_logits(toks, vocab))
        self.batches: list[list[tuple[int, int, str]]] = []  # per step: (start, n_tokens, picked or "none")

    def _slot(self, slot: int, pos: int) -> int:
        page = self.table[slot][pos // self.page_size]
        assert 0 < page < self.num_pages, f"slot {slot} reads page {page} at position {pos}"
        return page * self.page_size + pos % self.page_size

    def publish(self, slots: torch.Tensor, tokens: torch.Tensor) -> None:
        for slot, token in zip(slots.tolist(), tokens.tolist(), strict=True):
            self.last[slot] = token

    def shutdown(self) -> None:
        self.stopped = True

    def run(self, step) -> torch.Tensor:
        from dsa_runtime.model.step import StepKind, spans

        assert step.kind is StepKind.TARGET and step.num_rows, "the fake runs TARGET steps of at least one row"
        if step.pages is not None:
            for slot, col, page in step.pages.t().tolist():
                self.table[slot][col] = page
        slot, token, pos = step.rows.tolist()
        picked = set(range(len(slot)) if step.pick is None else step.pick.tolist())
        firsts, counts = spans(step.rows)
        self.batches.append([(pos[f], n, "last" if f + n - 1 in picked else "none")
                             for f, n in zip(firsts, counts, strict=True)])
        owner: dict[int, int] = {}
        for s, p in zip(slot, pos, strict=True):
            page = self.table[s][p // self.page_size]
            assert owner.setdefault(page, s) == s, "two slots of one step share a page"
        for s, t, p in zip(slot, token, pos, strict=True):
            self.slots[self._slot(s, p)] = t if t >= 0 else self.last[s]
        out = []
        for r in range(len(slot)) if step.pick is None else step.pick.tolist():
            tokens = [self.slots[self._slot(slot[r], q)] for q in range(pos[r] + 1)]
            assert None not in tokens, "read a cache slot that was never written"
            out.append(self.logit_fn(tokens))
        return torch.stack(out) if out else torch.zeros(0, self.vocab)


def make_parts(
    *,
    page_size: int = 4,
    num_pages: int = 257,
    max_model_len: int = 4096,
    logit_fn: Callable[[list[int]], torch.Tensor] | None = None,
    byte_tokenizer: bool = False,
) -> EngineParts:
    tok = FakeByteTokenizer() if byte_tokenizer else FakeTokenizer()
    return EngineParts(
        runner=FakeRunner(tok.vocab_size, page_size, num_pages, logit_fn),
        tokenizer=tok,
        allocator=FakeAllocator(num_pages),
        page_size=page_size,
        max_model_len=max_model_len,
        vocab_size=tok.vocab_size,
        eos_token_ids=frozenset({EOS}),
    )


def scripted(script: Sequence[int], prompt_len: int, vocab: int) -> Callable[[list[int]], torch.Tensor]:
    """Logits that make greedy decoding emit ``script`` after a prompt of ``prompt_len`` tokens."""

    def fn(tokens: list[int]) -> torch.Tensor:
        logits = hash_logits(tokens, vocab)
        i = len(tokens) - prompt_len
        if 0 <= i < len(script):
            logits[script[i]] = 50.0
        return logits

    return fn
