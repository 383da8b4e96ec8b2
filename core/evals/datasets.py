"""Question sets of ``--data``: a JSONL file, the downloaded gsm8k or a set shipped with the package.

A JSONL row is ``{"question": str, "answer": ...}``: a number answer is a number or a text whose answer is
its last number or the number after ``####`` (gsm8k's worked solutions); a row with ``"tools"`` (OpenAI
tool entries) expects tool calls, its answer the list ``[{"name", "arguments"}]`` in order.

Named sets:

* ``gsm8k``: the test split (1319 questions) of github.com/openai/grade-school-math, few-shot examples
  from its train split; downloaded on first use into ``$XDG_CACHE_HOME/dsa-runtime/datasets/gsm8k``
  (``~/.cache`` by default), never shipped;
* ``tinychat-arith`` / ``tinychat-tools``: held-out arithmetic and tool-call questions of the embedded
  model (``docs/tiny-model.md``), shipped in ``dsa_runtime/evals/data``, written by the training
  generator (``train/tinychat/eval_sets.py``).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsa_runtime.errors import ConfigError
from dsa_runtime.evals.extract import reference_answer

GSM8K_URL = "https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data/{split}.jsonl"
DATA_DIR = Path(__file__).parent / "data"


@dataclass(frozen=True)
class Question:
    """One question. ``answer``: the canonical number, or the expected calls ``[{"name", "arguments"}]``
    when ``tools`` is set; ``solution``: the reference's own text (a few-shot example's reply)."""

    question: str
    answer: str | list[dict[str, Any]]
    solution: str = ""
    tools: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class EvalSet:
    """A set's questions, where its few-shot examples come from, and its defaults.

    ``shots``: the examples' pool; None takes them from the head of ``questions`` (which then asks only the
    rest, so no question is its own example).
    """

    name: str
    questions: list[Question]
    shots: list[Question] | None = None
    num_shots: int = 5
    thinking: bool = False

    def split(self, num_shots: int) -> tuple[list[Question], list[Question]]:
        """``(examples, questions)`` for ``num_shots`` examples per prompt."""
        if num_shots and any(q.tools for q in self.questions):
            raise ConfigError(f"--num-shots {num_shots}: {self.name} asks for tool calls; run it with --num-shots 0")
        if self.shots is not None:
            if num_shots > len(self.shots):
                raise ConfigError(f"--num-shots {num_shots}: {self.name} has {len(self.shots)} examples")
            return self.shots[:num_shots], self.questions
        if num_shots >= len(self.questions):
            raise ConfigError(
                f"--num-shots {num_shots}: {self.name} has {len(self.questions)} rows; the examples come from its "
                "head and at least one must be left to ask"
            )
        return self.questions[:num_shots], self.questions[num_shots:]


NAMED = ("gsm8k", "tinychat-arith", "tinychat-tools")


def load(data: str) -> EvalSet:
    """The set ``data`` names: one of :data:`NAMED`, else a JSONL file. Raises ConfigError (one line)."""
    if data == "gsm8k":
        return EvalSet("gsm8k", read_jsonl(_gsm8k("test")), shots=read_jsonl(_gsm8k("train")))
    if data == "tinychat-arith":
        return EvalSet(data, read_jsonl(DATA_DIR / "tiny-chat-arith.jsonl"), num_shots=0, thinking=True)
    if data == "tinychat-tools":
        return EvalSet(data, read_jsonl(DATA_DIR / "tiny-chat-tools.jsonl"), num_shots=0)
    path = Path(data)
    if not path.is_file():
        raise ConfigError(f"--data {data}: neither a named set ({', '.join(NAMED)}) nor a file")
    return EvalSet(path.name, read_jsonl(path))


def read_jsonl(path: Path) -> list[Question]:
    """The questions of a JSONL file; a bad row raises ConfigError naming the file and line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(_question(json.loads(line)))
        except (ValueError, TypeError, KeyError) as exc:
            raise ConfigError(f"{path}:{number}: {exc}") from None
    if not out:
        raise ConfigError(f"{path}: no questions")
    return out


def _question(row: Any) -> Question:
    if not isinstance(row, dict):
        raise TypeError(f"a row must be a JSON object, got {type(row).__name__}")
    question, answer, tools = row["question"], row["answer"], row.get("tools")
    if not isinstance(question, str) or not question.strip():
        raise TypeError("'question' must be a non-empty string")
    if tools is None:
        if isinstance(answer, bool) or not isinstance(answer, str | int | float):
            raise TypeError("'answer' must be a number or a text ending in one")
        return Question(question, reference_answer(answer), solution=str(answer))
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise TypeError("'tools' must be a list of OpenAI tool objects")
    if not isinstance(answer, list) or not answer or not all(
        isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("arguments"), dict) for c in answer
    ):
        raise TypeError("with 'tools', 'answer' must be a list of {\"name\": str, \"arguments\": object}")
    return Question(question, answer, tools=tools)


def cache_dir() -> Path:
    """Where downloaded sets live: ``$XDG_CACHE_HOME/dsa-runtime/datasets`` (``~/.cache`` by default)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dsa-runtime" / "datasets"


def _gsm8k(split: str) -> Path:
    """The cached gsm8k split, downloaded first if missing (written whole or not at all)."""
    dest = cache_dir() / "gsm8k" / f"{split}.jsonl"
    if dest.is_file():
        return dest
    url = GSM8K_URL.format(split=split)
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            body = response.read()
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConfigError(
            f"cannot download gsm8k ({url}: {reason}); put the file at {dest} or pass --data FILE"
        ) from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_suffix(f".part{os.getpid()}")
    part.write_bytes(body)
    os.replace(part, dest)
    return dest
