"""Build the runner's ``ForwardBatch`` from a step's schedule (the engine's only contact with the model)."""

from __future__ import annotations

from collections.abc import Sequence

from dsa_runtime.engine.scheduler import ScheduledSeq
from dsa_runtime.model.batch import ForwardBatch, ForwardSeq


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


def score_batch(token_ids: list[int], start: int, pages: list[int]) -> ForwardBatch:
    """One sequence's chunk asking for logits at every position (``"all"``)."""
    return ForwardBatch(
        seqs=[ForwardSeq(token_ids=token_ids, start_pos=start, page_table=pages, logits="all")]
    )
