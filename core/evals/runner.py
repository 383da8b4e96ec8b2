"""Ask every question with ``parallel`` concurrent clients, score the replies, summarise.

The clients take questions in order from a shared queue, so at most ``parallel`` requests are in flight (the
batch the endpoint sees); a progress bar (tqdm, on stderr) counts answered questions.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Any

from dsa_runtime.evals.clients import Reply, RequestFailed, Sampling
from dsa_runtime.evals.datasets import Question
from dsa_runtime.evals.extract import check_calls, check_number
from dsa_runtime.evals.prompts import chat_messages


@dataclass
class Record:
    """One question's outcome. ``extracted``: the reply's number or its parsed calls (None if none)."""

    index: int
    question: str
    expected: Any
    extracted: Any
    correct: bool
    invalid: bool
    reply: str | None
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    error: str | None = None


def score(index: int, question: Question, reply: Reply, latency_s: float) -> Record:
    """The record of one reply (tool questions by their calls, the others by their last number)."""
    if question.tools:
        correct, invalid, got = check_calls(reply.tool_calls, question.answer)  # type: ignore[arg-type]
    else:
        correct, invalid, got = check_number(reply.content, question.answer)  # type: ignore[arg-type]
    return Record(index, question.question, question.answer, got, correct, invalid, reply.content,
                  reply.finish_reason, reply.prompt_tokens, reply.completion_tokens, latency_s)  # fmt: skip


async def evaluate(
    client: Any,
    questions: list[Question],
    examples: list[Question],
    sampling: Sampling,
    parallel: int,
    progress: bool = True,
) -> list[Record]:
    """Records of every question, in question order. ``client``: an ``HTTPClient`` / ``InProcessClient``."""
    from tqdm import tqdm

    todo = iter(range(len(questions)))  # shared: each client takes the next question
    records: list[Record | None] = [None] * len(questions)
    bar = tqdm(total=len(questions), unit="q", desc="eval", disable=not progress, dynamic_ncols=True)

    async def worker() -> None:
        for i in todo:
            q = questions[i]
            start = time.perf_counter()
            try:
                reply = await client.chat(chat_messages(q, examples), q.tools, sampling)
                records[i] = score(i, q, reply, time.perf_counter() - start)
            except RequestFailed as exc:
                records[i] = Record(i, q.question, q.answer, None, False, True, None, "error", 0, 0,
                                    time.perf_counter() - start, error=str(exc))  # fmt: skip
            done = [r for r in records if r is not None]
            bar.set_postfix(accuracy=f"{sum(r.correct for r in done) / len(done):.3f}", refresh=False)
            bar.update(1)

    tasks = [asyncio.ensure_future(worker()) for _ in range(min(parallel, len(questions)))]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:  # one client's fatal error stops the others
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        bar.close()
    return [r for r in records if r is not None]


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0-100) of a sorted, non-empty list."""
    return sorted_values[max(0, math.ceil(q / 100 * len(sorted_values)) - 1)]


def summarize(records: list[Record], wall_s: float) -> dict[str, Any]:
    """Accuracy, invalid answers, errors, tokens and latency of a run (``wall_s``: its duration)."""
    n = len(records)
    latencies = sorted(r.latency_s for r in records)
    completion = sum(r.completion_tokens for r in records)
    return {
        "questions": n,
        "correct": sum(r.correct for r in records),
        "accuracy": sum(r.correct for r in records) / n,
        "invalid": sum(r.invalid for r in records),
        "invalid_rate": sum(r.invalid for r in records) / n,
        "errors": sum(r.error is not None for r in records),
        "prompt_tokens": sum(r.prompt_tokens for r in records),
        "completion_tokens": completion,
        "wall_s": wall_s,
        "output_tokens_per_s": completion / wall_s if wall_s > 0 else 0.0,
        "latency_s": {"mean": sum(latencies) / n, "p50": _percentile(latencies, 50),
                      "p90": _percentile(latencies, 90), "max": latencies[-1]},  # fmt: skip
    }


def table(results: dict[str, Any]) -> str:
    """The summary as a two-column text table."""
    n, lat = results["questions"], results["latency_s"]
    rows = [
        ("accuracy", f"{results['accuracy']:.3f} ({results['correct']}/{n})"),
        ("invalid", f"{results['invalid_rate']:.3f} ({results['invalid']}/{n})"),
        ("errors", str(results["errors"])),
        ("prompt tokens", f"{results['prompt_tokens']} ({results['prompt_tokens'] / n:.1f} per question)"),
        ("output tokens", f"{results['completion_tokens']} ({results['completion_tokens'] / n:.1f} per question)"),
        ("output tokens/s", f"{results['output_tokens_per_s']:.1f}"),
        ("latency mean / p50 / p90 / max",
         f"{lat['mean']:.2f} / {lat['p50']:.2f} / {lat['p90']:.2f} / {lat['max']:.2f} s"),
        ("wall time", f"{results['wall_s']:.1f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
