"""Few-shot chat prompts: each example is a user turn (its question) and an assistant turn (its solution).

A solution ends with ``The answer is N.``: gsm8k's worked solutions lose their calculator notes
(``<<48/2=24>>``) and their ``#### N`` line becomes that sentence; a bare-number reference is that sentence
alone. The model then answers the last user turn, the question asked.
"""

from __future__ import annotations

import re
from typing import Any

from dsa_runtime.evals.datasets import Question

_CALCULATOR = re.compile(r"<<[^<>]*>>")


def solution_text(example: Question) -> str:
    """The assistant turn of a few-shot example."""
    worked = example.solution.rsplit("####", 1)[0] if "####" in example.solution else ""
    worked = _CALCULATOR.sub("", worked).strip()
    return f"{worked}\nThe answer is {example.answer}.".strip()


def chat_messages(question: Question, examples: list[Question]) -> list[dict[str, Any]]:
    """The messages of one request: the examples' turns, then the question."""
    messages: list[dict[str, Any]] = []
    for example in examples:
        messages.append({"role": "user", "content": example.question})
        messages.append({"role": "assistant", "content": solution_text(example)})
    messages.append({"role": "user", "content": question.question})
    return messages
