"""Literal markers of the DeepSeek output formats and the prefix test every streaming stage relies on.

Every marker starts with ``<``, so a stage only ever has to look closely at text from a ``<`` onwards; the
``｜`` in special tokens is U+FF5C and ``▁`` is U+2581 (never typed in prose, which is why a fragment that
starts with ``<｜`` is treated as markup even when it is cut off).
"""

from __future__ import annotations

from collections.abc import Iterable

# The V3.2 special tokens are defined once, with the encoder's prompt text; re-exported for the parsers.
from dsa_runtime.parsers.tools_prompt_v32 import DSML as DSML
from dsa_runtime.parsers.tools_prompt_v32 import EOS as EOS
from dsa_runtime.parsers.tools_prompt_v32 import THINK_END as THINK_END
from dsa_runtime.parsers.tools_prompt_v32 import THINK_START as THINK_START

# V3 / V3.1 / R1 special-token tool-call format.
TOOL_CALLS_BEGIN = "<\uff5ctool\u2581calls\u2581begin\uff5c>"
TOOL_CALLS_END = "<\uff5ctool\u2581calls\u2581end\uff5c>"
TOOL_CALL_BEGIN = "<\uff5ctool\u2581call\u2581begin\uff5c>"
TOOL_CALL_END = "<\uff5ctool\u2581call\u2581end\uff5c>"
TOOL_SEP = "<\uff5ctool\u2581sep\uff5c>"

# Text that ends reasoning because a tool block starts (the marker itself stays for the tool parser).
# Only fullwidth-marked forms: a plain "<function_calls>" inside reasoning is more likely prose about tags.
DSML_STARTS = ("<" + DSML + "function_call", "<" + DSML + "tool_calls", "<" + DSML + "invoke")
TOKEN_STARTS = (TOOL_CALLS_BEGIN, TOOL_CALL_BEGIN)


class Partial:
    """Sentinel: the text so far is a strict prefix of a marker; wait for more before deciding."""

    def __repr__(self) -> str:
        return "PARTIAL"


PARTIAL = Partial()


def match_literal(buf: str, pos: int, literals: Iterable[str]) -> str | Partial | None:
    """The literal that starts at ``buf[pos]``, ``PARTIAL`` if ``buf[pos:]`` could still become one, else None.

    None of the literal sets used overlap as prefixes of one another, so the first full match is the match.
    """
    rest_len = len(buf) - pos
    partial = False
    for lit in literals:
        if buf.startswith(lit, pos):
            return lit
        if rest_len < len(lit) and lit.startswith(buf[pos:]):
            partial = True
    return PARTIAL if partial else None


def is_special_fragment(text: str) -> bool:
    """True for a cut-off special-token marker (``<｜...``/``</｜...``): markup, never shown as text."""
    return text.startswith("<\uff5c") or text.startswith("</\uff5c")
