"""Expert-parallel load figures for the engine's stats: token rows received per EP rank, and their imbalance.

Every rank counts on its device the token rows its experts receive (``MoE.tokens_received``); rank 0 gathers
the counts at most once per ``interval_s`` (a small gather on the control group between steps, never inside
one), so the figures cost nothing per step. The imbalance is ``max / mean`` over the EP ranks of the rows
received since the previous reading: per step on average over that window (1.0 = perfectly even).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class EPLoad:
    """``runner``: a :class:`~dsa_runtime.distributed.runtime.DistributedRunner` with ``--ep-size`` > 1."""

    runner: Any
    interval_s: float = 1.0
    totals: list[int] = field(default_factory=list)
    imbalance: float = 0.0
    _read_at: float = float("-inf")
    _steps: int = 0

    def read(self, steps: int) -> tuple[tuple[int, ...], float]:
        """``(rows received per EP rank so far, max / mean of the last window)``; ``steps``: steps run so far."""
        now = time.monotonic()
        if steps != self._steps and now - self._read_at >= self.interval_s and not self.runner.closed:
            totals = self.runner.ep_tokens()
            delta = [a - b for a, b in zip(totals, self.totals or [0] * len(totals), strict=True)]
            mean = sum(delta) / len(delta)
            if mean > 0:
                self.imbalance = max(delta) / mean
            self.totals, self._read_at, self._steps = totals, now, steps
        return tuple(self.totals), self.imbalance
