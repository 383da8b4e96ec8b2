"""Stop strings matched across token boundaries, and the text a stream may release safely.

Text is released only when it cannot be the start of a stop string: the longest suffix of the text that is a
proper prefix of some stop string is held back until the next token decides it.
"""

from __future__ import annotations

from collections.abc import Sequence


def find_stop(text: str, stops: Sequence[str], new_chars: int) -> tuple[int, str] | None:
    """Earliest stop string occurring in ``text`` that involves one of the last ``new_chars`` characters.

    Returns ``(position, stop_string)`` or None. Matches wholly inside older text were checked when that text
    arrived, so only the window that can contain a new match is searched.
    """
    if not stops or new_chars <= 0:
        return None
    longest = max(len(s) for s in stops)
    start = max(0, len(text) - new_chars - longest + 1)
    best: tuple[int, str] | None = None
    for stop in stops:
        pos = text.find(stop, start)
        if pos != -1 and (best is None or pos < best[0] or (pos == best[0] and len(stop) > len(best[1]))):
            best = (pos, stop)
    return best


def held_back(text: str, stops: Sequence[str]) -> int:
    """Number of trailing characters of ``text`` that could still grow into a stop string."""
    hold = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:k]):
                hold = k
                break
    return hold
