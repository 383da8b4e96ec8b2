"""Parser registrations: chat encoders, tool-call parsers and reasoning parsers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

ParserKind = Literal["encoder", "tool", "reasoning"]
PARSER_KINDS: tuple[ParserKind, ...] = ("encoder", "tool", "reasoning")


@dataclass(frozen=True)
class ParserSpec:
    """One parser registered through ``dsa_register_parsers(register)``.

    Attributes:
        name: unique within its kind (``deepseekv32``, ``deepseekv31``, ``deepseekv3``, ``deepseek-r1``...).
        kind: ``"encoder"`` (messages -> prompt), ``"tool"`` (tool-call parser) or ``"reasoning"``.
        factory: ``"module:attr"`` (imported lazily) or a callable producing the parser class/function.
        aliases: other accepted names (e.g. ``deepseek_v32``).
        description: one line for listings.
        plugin: filled in by the plugin manager.
    """

    name: str
    kind: ParserKind
    factory: str | Callable[..., object]
    aliases: tuple[str, ...] = ()
    description: str = ""
    plugin: str = ""

    def __post_init__(self) -> None:
        if self.kind not in PARSER_KINDS:
            raise ValueError(f"parser {self.name!r}: kind must be one of {PARSER_KINDS}, not {self.kind!r}")
