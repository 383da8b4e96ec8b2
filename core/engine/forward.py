"""Build the runner's ``ForwardBatch`` from a step's schedule (the engine's only contact with the model)."""

from __future__ import annotations

from collections.abc import Sequence

from dsa_runtime.engine.scheduler import ScheduledSeq

try:
    from dsa_runtime.model.batch import ForwardBatch, ForwardSeq
except ImportError:  # pragma: no cover - until the model package lands; same fields (INTERFACES.md)
    from dataclasses import dataclass, field

    @dataclass
    class ForwardSeq:  # type: ignore[no-redef]
        token_ids: list[int]
        start_pos: int
        page_table: list[int]
        logits: str = "last"

    @dataclass
    class ForwardBatch:  # type: ignore[no-redef]
        seqs: list[ForwardSeq] = field(default_factory=list)


def make_batch(plan: Sequence[ScheduledSeq]) -> ForwardBatch:
    """One ``ForwardSeq`` per scheduled request: its next tokens, cache position and page table.

    Only sequences whose chunk ends their known tokens ask for logits (``"last"``): the token sampled from
    them is the next one; earlier prefill chunks only fill the cache (``"none"``).
    """
    seqs = []
    for item in plan:
        request = item.request
        seqs.append(
            ForwardSeq(
                token_ids=request.token_ids[item.start : item.start + item.num_tokens],
                start_pos=item.start,
                page_table=list(request.pages),
                logits="last" if item.sample else "none",
            )
        )
    return ForwardBatch(seqs=seqs)
