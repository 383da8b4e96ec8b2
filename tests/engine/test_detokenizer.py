"""Incremental detokenisation: never a split UTF-8 character, text equal to one full decode."""

from __future__ import annotations

import random

import pytest

from dsa_runtime.engine.detokenizer import ByteDetokenizer, IncrementalDetokenizer, make_detokenizer
from dsa_runtime.engine.stop import find_stop, held_back
from tests.engine.fakes import BYTE0, EOS, FakeByteTokenizer, FakeTokenizer

BOTH = pytest.mark.parametrize("tok", [FakeTokenizer(), FakeByteTokenizer()], ids=["window", "bytes"])

TEXT = "Hello wörld 日本語 🙂 é!"


def _bytes_ids(text: str) -> list[int]:
    return [BYTE0 + b for b in text.encode()]


@BOTH
def test_multibyte_characters_split_across_tokens_are_never_split(tok):
    ids = _bytes_ids(TEXT)  # every byte its own token: 🙂 spans 4 tokens, 日 3
    detok = make_detokenizer(tok, [5, 6], skip_special_tokens=True)
    deltas = [detok.add(t) for t in ids] + [detok.flush()]
    assert "".join(deltas) == TEXT
    assert all("\ufffd" not in d for d in deltas)
    assert deltas[len(_bytes_ids("Hello wö")) - 2] == ""  # first byte of ö is held back


@BOTH
def test_mixed_word_and_byte_tokens_random_splits(tok):
    rng = random.Random(0)
    for _ in range(50):
        text = "".join(rng.choice(["日本", "é", "x", " world", "🙂", "Hello", "ß"]) for _ in range(8))
        ids = tok.encode(text)
        detok = make_detokenizer(tok, tok.encode("prompt é"), skip_special_tokens=True)
        deltas = [detok.add(t) for t in ids]
        assert "".join(deltas) + detok.flush() == text
        assert all("\ufffd" not in d for d in deltas)


@BOTH
def test_invalid_bytes_are_released_after_max_hold_and_at_flush(tok):
    detok = make_detokenizer(tok, [], skip_special_tokens=True)
    lone = BYTE0 + 0xE6  # first byte of a 3-byte character, never completed
    assert detok.add(lone) == ""
    out = detok.add(BYTE0 + ord("a"))
    assert out == "\ufffda"
    detok2 = make_detokenizer(tok, [], skip_special_tokens=True)
    assert detok2.add(lone) == "" and detok2.flush() == "\ufffd"


@BOTH
def test_special_tokens_skipped_or_shown(tok):
    ids = tok.encode("ab") + [EOS] + tok.encode("c")
    shown = make_detokenizer(tok, [], skip_special_tokens=False)
    assert "".join(shown.add(t) for t in ids) == "ab<eos>c"
    hidden = make_detokenizer(tok, [], skip_special_tokens=True)
    assert "".join(hidden.add(t) for t in ids) == "abc"


def test_factory_picks_the_byte_detokenizer_when_token_bytes_exist():
    assert isinstance(make_detokenizer(FakeByteTokenizer(), []), ByteDetokenizer)
    assert isinstance(make_detokenizer(FakeTokenizer(), []), IncrementalDetokenizer)


def test_find_stop_across_boundaries_and_earliest_match():
    assert find_stop("abcST", ["STOP"], 2) is None
    assert find_stop("abcSTOP", ["STOP"], 2) == (3, "STOP")
    assert find_stop("xxENDyySTOP", ["STOP", "END"], 11) == (2, "END")
    # a match wholly inside old text is not searched again
    assert find_stop("ENDabcdefgh", ["END"], 2) is None
    assert find_stop("abc", [], 3) is None


def test_held_back_is_the_longest_stop_prefix_suffix():
    assert held_back("hello ST", ["STOP"]) == 2
    assert held_back("hello S", ["STOP", "SX"]) == 1
    assert held_back("hello", ["STOP"]) == 0
    assert held_back("aaa", ["aaab"]) == 3
