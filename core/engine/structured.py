"""Structured output: sampling constrained by a grammar (JSON schema, any JSON object, regex, EBNF) with xgrammar.

xgrammar is optional (``pip install "dsa-runtime[structured]"``) and imported on the first constrained request.
A :class:`GrammarBackend` per process holds the tokenizer's vocabulary in xgrammar's form (built once) and a
compiler whose cache keys compiled grammars by their source, so a schema sent with every request compiles
once. Each constrained request carries a :class:`GrammarState`: its matcher, advanced with every accepted token.
Before sampling, the step's logits rows of active matchers are masked in one batched call
(``apply_token_bitmask_inplace``, on the logits' device) so that only tokens the grammar allows can be drawn;
once the grammar is complete only the stop tokens are left, and accepting one terminates the matcher.

A reasoning model thinks first: with ``after_token_id`` (the ``</think>`` id of a thinking turn) the constraint
starts with the token after it, as in vLLM and SGLang.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch

# Each kind and how an error message names its grammar.
KIND_NAMES = {"json_schema": "JSON schema", "json_object": "JSON", "regex": "regex", "ebnf": "grammar",
              "structural_tag": "structural tag"}
INSTALL_HINT = 'structured output needs xgrammar: pip install "dsa-runtime[structured]"'


class StructuredOutputUnavailable(RuntimeError):
    """xgrammar is not installed (the ``structured`` extra)."""


@dataclass(frozen=True)
class StructuredOutput:
    """What a request's output must match.

    Attributes:
        kind: ``"json_schema"`` (``spec``: the schema as JSON text), ``"json_object"`` (any JSON object; no
            spec), ``"regex"``, ``"ebnf"`` (xgrammar's EBNF, ``root ::= ...``) or ``"structural_tag"``
            (xgrammar's structural tag as JSON text: how strict DSML tool calls are constrained).
        spec: the grammar's source text (None for ``json_object``).
        after_token_id: the constraint starts after this token is generated (``</think>``); None: at once.
    """

    kind: str
    spec: str | None = None
    after_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KIND_NAMES:
            raise ValueError(f"structured output kind must be one of {', '.join(KIND_NAMES)}, got {self.kind!r}")
        if self.kind != "json_object" and not isinstance(self.spec, str):
            raise ValueError(f"structured output of kind {self.kind!r} needs its spec as a string")

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str, after_token_id: int | None = None) -> StructuredOutput:
        text = schema if isinstance(schema, str) else json.dumps(schema)  # the properties keep their order
        return cls("json_schema", text, after_token_id)


class GrammarState:
    """One request's matcher. ``active`` is False until ``after_token_id`` has been generated."""

    def __init__(self, matcher: Any, after_token_id: int | None) -> None:
        self.matcher = matcher
        self.after = after_token_id
        self.active = after_token_id is None

    def accept(self, token: int) -> str | None:
        """Advance with a generated token. Returns None to go on, ``"stop"`` once the grammar has terminated
        (complete, and its stop token accepted), ``"rejected"`` for a token the grammar does not allow (it
        cannot happen after masking; the request then ends without claiming a complete output)."""
        if not self.active:
            self.active = token == self.after
            return None
        if not self.matcher.accept_token(token):
            return "rejected"
        return "stop" if self.matcher.is_terminated() else None


class GrammarBackend:
    """xgrammar's view of one tokenizer: compile grammars (cached) and mask logits.

    Args:
        tokenizer: :class:`dsa_runtime.loader.tokenizer.Tokenizer` (``token_bytes``, ``added_tokens``).
        vocab_size: logits width (the model's vocabulary; ids past the tokenizer's are never allowed).
        stop_token_ids: ids that end a complete output (the end-of-sequence token).
    """

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        xgr = _xgrammar()
        # Raw bytes per id; special tokens (BOS, EOS, role markers) as empty strings, which xgrammar treats as
        # special: never part of a constrained output. Added tokens that are not special (｜DSML｜, <think>,
        # V3.1's tool markers) keep their text: DSML tool calls are written with them.
        special = set(tokenizer.special_ids)
        added = set(tokenizer.added_tokens.values())
        vocab = [b"" if i in special else tokenizer.token_bytes(i) for i in range(min(len(tokenizer), vocab_size))]
        self.vocab_size = vocab_size

        def compiler(tokens: list[bytes]) -> Any:
            info = xgr.TokenizerInfo(tokens, xgr.VocabType.RAW, vocab_size=vocab_size,
                                     stop_token_ids=list(stop_token_ids))
            return xgr.GrammarCompiler(info, max_threads=2, cache_enabled=True)

        self.compiler = compiler(vocab)
        # Compact JSON holds no raw control character (U+0000-U+001F) anywhere: JSON grammars get a vocabulary
        # without the tokens that carry one (xgrammar 0.2.8's length-bounded strings accept them, and a strict
        # JSON parser then refuses the output), nor the added tokens ("<think>" is no JSON string content).
        self.json_compiler = compiler([b"" if i in added or any(c < 0x20 for c in t) else t
                                       for i, t in enumerate(vocab)])
        self._bitmask: torch.Tensor | None = None

    def compile(self, spec: StructuredOutput) -> Any:
        """The compiled grammar; ``ValueError`` naming what is wrong for an invalid schema / regex / grammar."""
        try:
            # Compact JSON (", " and ": " separators, no free whitespace): a sampled model cannot spend its
            # token budget on blank lines between the values.
            if spec.kind == "json_schema":
                return self.json_compiler.compile_json_schema(spec.spec, any_whitespace=False, strict_mode=True)
            if spec.kind == "json_object":
                return self.json_compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if spec.kind == "regex":
                return self.compiler.compile_regex(spec.spec)
            if spec.kind == "structural_tag":
                return self.compiler.compile_structural_tag(spec.spec)
            return self.compiler.compile_grammar(spec.spec)
        except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError / its own errors for bad input
            raise ValueError(f"invalid {KIND_NAMES[spec.kind]}: {str(exc).strip().splitlines()[0][:300]}") from None

    def state(self, spec: StructuredOutput) -> GrammarState:
        return GrammarState(_xgrammar().GrammarMatcher(self.compile(spec)), spec.after_token_id)

    def mask(self, logits: torch.Tensor, states: list[GrammarState | None]) -> None:
        """Mask ``logits`` ``[n, vocab]`` (fp32, any device) in place: row i keeps only the tokens that
        ``states[i]``'s grammar allows next (rows without an active state are left alone)."""
        xgr = _xgrammar()
        rows = [i for i, s in enumerate(states) if s is not None and s.active and not s.matcher.is_terminated()]
        if not rows:
            return
        n = len(states)
        if self._bitmask is None or self._bitmask.shape[0] < n:
            self._bitmask = xgr.allocate_token_bitmask(max(n, 16), self.vocab_size)
        bitmask = self._bitmask[:n]
        for i in rows:
            states[i].matcher.fill_next_token_bitmask(bitmask, i)  # type: ignore[union-attr]
        xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True),
                                        vocab_size=self.vocab_size, indices=rows)


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError:
        raise StructuredOutputUnavailable(INSTALL_HINT) from None
    return xgrammar
