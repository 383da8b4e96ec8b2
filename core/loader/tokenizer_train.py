"""Train the tiny models' byte-level BPE tokenizer on the text this package ships.

The vocabulary holds DeepSeek's special tokens with the real strings (``｜`` is U+FF5C, ``▁`` U+2581):
``<｜begin▁of▁sentence｜>`` is id 0 and ``<｜end▁of▁sentence｜>`` id 1 as in the real config; every other
marker lands wherever this small vocabulary puts it, so callers must look ids up by string.

* special (hidden by ``skip_special_tokens``): bos, eos, pad, ``<｜User｜>``, ``<｜Assistant｜>``, the FIM
  tokens and ``<|EOT|>``;
* added but not special (always decoded, the output parsers need them): ``<think>``, ``</think>``, the V3/V3.1
  tool-call markers and the V3.2 ``｜DSML｜`` prefix.

Training is deterministic: same corpus bytes and same ``tokenizers`` version give the same ``tokenizer.json``.
"""

from __future__ import annotations

from importlib import resources

SPECIAL_TOKENS: tuple[str, ...] = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜▁pad▁｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜fim▁hole｜>",
    "<｜fim▁begin｜>",
    "<｜fim▁end｜>",
    "<|EOT|>",
)
BOS_TOKEN, EOS_TOKEN, PAD_TOKEN = SPECIAL_TOKENS[:3]

MARKER_TOKENS: tuple[str, ...] = (
    "<think>",
    "</think>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
    "<｜tool▁sep｜>",
    "｜DSML｜",
)

CORPUS_FILE = "tokenizer_corpus.txt"


def corpus_text() -> str:
    """The shipped training text (``dsa_runtime/loader/data/tokenizer_corpus.txt``)."""
    return resources.files("dsa_runtime.loader").joinpath("data", CORPUS_FILE).read_text(encoding="utf-8")


def bpe_trainer(vocab_size: int):
    """The byte-level BPE trainer of every tokenizer we make: the specials first, in this order (bos id 0, eos id
    1), the 256 byte symbols, merges up to ``vocab_size`` less the markers, which are added after training."""
    from tokenizers import AddedToken, pre_tokenizers, trainers

    return trainers.BpeTrainer(
        vocab_size=vocab_size - len(MARKER_TOKENS),
        min_frequency=2,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )


def train_tokenizer(vocab_size: int):
    """A ``tokenizers.Tokenizer`` of exactly ``vocab_size`` ids (specials + 256 bytes + merges + markers).

    Raises ValueError if the corpus cannot supply enough merges for ``vocab_size``.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = bpe_trainer(vocab_size)
    # One "line" per paragraph keeps the input order, hence the merge ties, fixed.
    tok.train_from_iterator(corpus_text().split("\n\n"), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKER_TOKENS])
    size = tok.get_vocab_size(with_added_tokens=True)
    if size != vocab_size:
        raise ValueError(f"tokenizer corpus gives {size} tokens, not the {vocab_size} requested")
    if tok.token_to_id(BOS_TOKEN) != 0 or tok.token_to_id(EOS_TOKEN) != 1:
        raise ValueError("tokenizer training did not put bos at id 0 and eos at id 1")
    return tok
