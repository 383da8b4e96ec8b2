"""The tiny tokenizer: DeepSeek special tokens by string, UTF-8 round trips, bytes per token, determinism."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys

import pytest

from dsa_runtime.loader.errors import LoadError
from dsa_runtime.loader.presets import TINY_VOCAB_SIZE
from dsa_runtime.loader.tokenizer import byte_level_decoder, load_tokenizer
from dsa_runtime.loader.tokenizer_train import MARKER_TOKENS, SPECIAL_TOKENS, train_tokenizer
from dsa_runtime.parsers.markers import DSML, TOOL_CALLS_BEGIN
from dsa_runtime.parsers.tools_prompt_v32 import ASSISTANT, BOS, EOS, THINK_END, THINK_START, USER

SAMPLES = [
    "Hello",
    "Hello, world! How are you today?",
    "  leading spaces, trailing tab\t and\nnew\r\nlines  ",
    "def f(x):\n    return x ** 2  # squares\n",
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}',
    "Symbols ½ ± ≤ ∞ √ π € 你好，世界 こんにちは 🙂🚀 👍🏽 ❤️ e\u0301 \u200b\ufeff",
    "",
]


def _random_text(rng: random.Random, n: int) -> str:
    pools = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x4E00, 0x4FFF), (0x1F300, 0x1F64F), (0x0, 0x1F)]
    out = []
    for _ in range(n):
        lo, hi = rng.choice(pools)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def test_vocab_size_and_bos_eos_by_string(tokenizer):
    assert tokenizer.vocab_size == TINY_VOCAB_SIZE == len(tokenizer)
    assert tokenizer.bos_id == tokenizer.token_to_id(BOS) == 0
    assert tokenizer.eos_id == tokenizer.token_to_id(EOS) == 1
    assert tokenizer.id_to_token(tokenizer.eos_id) == EOS


def test_every_deepseek_marker_is_one_token(tokenizer):
    for text in (*SPECIAL_TOKENS, *MARKER_TOKENS, USER, ASSISTANT, THINK_START, THINK_END, DSML, TOOL_CALLS_BEGIN):
        ids = tokenizer.encode(text)
        assert ids == [tokenizer.token_to_id(text)], text
    assert len({tokenizer.token_to_id(t) for t in (*SPECIAL_TOKENS, *MARKER_TOKENS)}) == len(SPECIAL_TOKENS) + len(
        MARKER_TOKENS
    )


def test_special_ids_hide_control_tokens_but_keep_parser_markers(tokenizer):
    assert {tokenizer.token_to_id(t) for t in SPECIAL_TOKENS} == set(tokenizer.special_ids)
    text = f"{BOS}{USER}Hi{ASSISTANT}{THINK_START}hmm{THINK_END}<{DSML}invoke name=\"x\">{EOS}"
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == f"Hi{THINK_START}hmm{THINK_END}<{DSML}invoke name=\"x\">"


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip_samples(tokenizer, text):
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.convert_ids_to_bytes(ids) == text.encode("utf-8")


def test_round_trip_random_unicode(tokenizer):
    rng = random.Random(1234)
    for _ in range(200):
        text = _random_text(rng, rng.randint(1, 40))
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text, repr(text)
        assert b"".join(tokenizer.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_common_words_are_merged(tokenizer):
    # a trained BPE, not a byte fallback: frequent English costs about one token per word
    text = "The capital of France is Paris."
    assert len(tokenizer.encode(text)) <= 12 < len(text.encode())


def test_partial_multibyte_token_bytes(tokenizer):
    ids = tokenizer.encode("🙂")
    assert len(ids) >= 2  # a rare emoji is split into byte pieces
    assert tokenizer.decode(ids[:1]).endswith("\ufffd")
    assert tokenizer.token_bytes(ids[0]) == "🙂".encode()[: len(tokenizer.token_bytes(ids[0]))]


def test_add_special_tokens_prepends_bos_only(tokenizer):
    assert tokenizer.encode("Hello", add_special_tokens=True) == [tokenizer.bos_id, *tokenizer.encode("Hello")]


def test_out_of_range_id_is_a_clear_error(tokenizer):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.decode([tokenizer.vocab_size])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.token_bytes(-1)


def test_byte_level_table_is_the_tokenizers_alphabet():
    from tokenizers import pre_tokenizers

    table = byte_level_decoder()
    assert set(table) == set(pre_tokenizers.ByteLevel.alphabet())
    assert sorted(table.values()) == list(range(256))


def test_training_is_deterministic_across_processes():
    here = hashlib.sha256(train_tokenizer(TINY_VOCAB_SIZE).to_str().encode()).hexdigest()
    code = (
        "import hashlib; from dsa_runtime.loader.tokenizer_train import train_tokenizer; "
        "print(hashlib.sha256(train_tokenizer(1024).to_str().encode()).hexdigest())"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert here == other


def test_too_large_vocab_is_refused():
    with pytest.raises(ValueError, match="tokens, not the"):
        train_tokenizer(200_000)


def test_load_errors(tmp_path, tiny_v32_dir):
    with pytest.raises(LoadError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": ', encoding="utf-8")
    with pytest.raises(LoadError, match=r"tokenizer.json: invalid JSON at line 1"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0"}', encoding="utf-8")
    with pytest.raises(LoadError, match="not a valid tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_bytes((tiny_v32_dir / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos-not-here>"}), encoding="utf-8")
    with pytest.raises(LoadError, match="eos_token '<eos-not-here>' is not in the vocabulary"):
        load_tokenizer(tmp_path)
    # plain-string token entries work, and the ids follow the strings, not fixed numbers
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": USER}), encoding="utf-8")
    assert load_tokenizer(tmp_path / "tokenizer.json").eos_id == load_tokenizer(tmp_path).token_to_id(USER)
