"""Value picker of the synthetic data: entries of the training or held-out word lists, or invented values.

Invented values (pronounceable made-up words, never equal to a held-out entity or any of its words) teach
the model to copy arguments from the request rather than recall a list.
"""

from __future__ import annotations

import random

from train.tinychat import world as W

_ONSETS = ("b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "br",
           "ch", "dr", "gr", "kr", "pl", "sh", "st", "tr", "th", "y", "q", "x", "bl", "fr", "sk", "sl", "sp",
           "gl", "kh", "ts", "zh", "", "")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ou", "ia", "y", "ee", "oo", "ei", "au", "ua", "io")
_CODAS = ("", "", "", "n", "r", "s", "l", "m", "t", "k", "sh", "nd", "nt", "st", "x", "ck", "rg", "ng")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_HELDOUT_WORDS = frozenset(w.lower() for group in (W.HELDOUT_CITIES, W.HELDOUT_NAMES, W.HELDOUT_TOPICS,
                                                    W.HELDOUT_ITEMS, W.HELDOUT_TICKERS, W.HELDOUT_PHRASES)
                           for v in group for w in (v, *v.split()))


class Pick:
    """Random choices from the training lists (``heldout=False``) or the held-out ones.

    ``invent`` (training only) is the share of entity slots (cities, names, topics, items, tickers,
    phrases) filled with an invented pronounceable word instead of a list entry, so that the only way to
    get those arguments right is to copy them from the request. An invented value never equals a held-out
    entity or one of its words. With ``invent`` 0 the random stream is exactly that of round 1 (the
    tokenizer is trained on it).
    """

    def __init__(self, rng: random.Random, heldout: bool, invent: float = 0.0) -> None:
        self.rng, self.heldout, self.invent = rng, heldout, 0.0 if heldout else invent

    def _pool(self, train: tuple, held: tuple) -> tuple:
        # Held-out conversations mix held-out entities with training ones, as real requests would.
        return held if self.heldout and self.rng.random() < 0.7 else train

    def _fresh(self) -> bool:
        return self.invent > 0 and self.rng.random() < self.invent

    def word(self, lo: int = 1, hi: int = 3) -> str:
        """An invented lowercase word of ``lo``..``hi`` syllables, never a held-out entity word."""
        r = self.rng
        while True:
            if r.random() < 0.15:  # any letters: the model must copy what it cannot pronounce too
                w = "".join(r.choice(_LETTERS) for _ in range(r.randint(2 * lo + 1, 3 * hi + 1)))
            else:
                w = "".join(r.choice(_ONSETS) + r.choice(_VOWELS) for _ in range(r.randint(lo, hi))) + r.choice(_CODAS)
            if len(w) >= 2 and w not in _HELDOUT_WORDS:
                return w

    def _proper(self, max_words: int) -> str:
        words = [self.word(1, 3).capitalize() for _ in range(self.rng.choice((1, 1, 1, max_words)))]
        out = " ".join(words)
        x = self.rng.random()
        if x < 0.06:
            out = out.lower()
        elif x < 0.1:
            out = out.upper()
        return out if out.lower() not in _HELDOUT_WORDS else self._proper(max_words)

    def city(self) -> str:
        return self._proper(2) if self._fresh() else self.rng.choice(self._pool(W.CITIES, W.HELDOUT_CITIES))

    def name(self) -> str:
        return self._proper(1) if self._fresh() else self.rng.choice(self._pool(W.FIRST_NAMES, W.HELDOUT_NAMES))

    def topic(self) -> str:
        if self._fresh():
            return " ".join(self.word() for _ in range(self.rng.randint(1, 3)))
        return self.rng.choice(self._pool(W.TOPICS, W.HELDOUT_TOPICS))

    def items(self, n: int) -> list[str]:
        out = self.rng.sample(self._pool(W.ITEMS, W.HELDOUT_ITEMS) if n <= 4 else W.ITEMS, n)
        if self.invent > 0:
            out = [self.word() if self._fresh() else x for x in out]
            if len(set(out)) < len(out):
                return self.items(n)
        return out

    def ticker(self) -> str:
        if self._fresh():
            r = self.rng
            while True:
                t = "".join(r.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(r.randint(3, 5)))
                if t.lower() not in _HELDOUT_WORDS and t not in W.TICKERS:
                    return t
        return self.rng.choice(self._pool(W.TICKERS, W.HELDOUT_TICKERS))

    def phrase(self) -> str:
        if self._fresh():
            return " ".join(self.word() for _ in range(self.rng.randint(2, 4)))
        return self.rng.choice(self._pool(W.PHRASES, W.HELDOUT_PHRASES))

    def choice(self, seq):
        return self.rng.choice(seq)

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def date(self) -> str:
        return f"2026-{self.rng.randint(1, 12):02d}-{self.rng.randint(1, 28):02d}"

    def clock(self) -> str:
        return f"{self.rng.randint(6, 21):02d}:{self.rng.choice(('00', '15', '30', '45'))}"

    def bool(self) -> bool:
        return self.rng.random() < 0.5
