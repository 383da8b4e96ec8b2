"""The tiny-chat tokenizer: byte-level BPE trained on generated conversations plus the shipped corpus.

Same special tokens and markers as the random presets' tokenizer (looked up by string, bos id 0, eos id 1);
digits are split one per token so the arithmetic traces work digit by digit.
"""

from __future__ import annotations

from dsa_runtime.loader.tokenizer_train import (
    BOS_TOKEN,
    EOS_TOKEN,
    MARKER_TOKENS,
    SPECIAL_TOKENS,
    bpe_trainer,
    corpus_text,
)
from train.tinychat.dataset import conversations, render

TOKENIZER_SAMPLES = 3000


def train_chat_tokenizer(vocab_size: int, samples: int = TOKENIZER_SAMPLES):
    """A ``tokenizers.Tokenizer`` of exactly ``vocab_size`` ids (deterministic for a fixed package)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = bpe_trainer(vocab_size)
    texts = corpus_text().split("\n\n")
    texts += [render(c).text for c in conversations(samples, heldout=False, seed=7)]
    # The marker strings must not be learnt as merges of their pieces: strip them from the training text.
    for marker in (*SPECIAL_TOKENS, *MARKER_TOKENS):
        texts = [t.replace(marker, " ") for t in texts]
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKER_TOKENS])
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise ValueError(f"tokenizer has {tok.get_vocab_size(with_added_tokens=True)} ids, not {vocab_size}")
    if tok.token_to_id(BOS_TOKEN) != 0 or tok.token_to_id(EOS_TOKEN) != 1:
        raise ValueError("tokenizer training did not put bos at id 0 and eos at id 1")
    return tok
