"""The held-out evaluation sets of ``dsa-runtime eval`` (``--data tinychat-arith`` / ``tinychat-tools``).

The runtime ships the sets as JSONL (``dsa_runtime/evals/data``) because this generator is training code,
not part of the package; ``tests/tinychat/test_eval_sets.py`` checks the shipped files are byte for byte
what this module writes. Rows are those of ``--data FILE``:

* arithmetic: ``{"question", "answer"}`` -- held-out operand pairs, the answer a number;
* tools: ``{"question", "tools", "answer"}`` -- held-out entities and tool pairs, the answer the list of
  expected calls ``[{"name", "arguments"}]`` (in order).

``python -m train.tinychat.eval_sets core/evals/data`` rewrites them.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

from train.tinychat.dialogs import sample

SEED = 4242  # apart from bench/tiny_eval.py's seeds, so the two draw different held-out questions
SIZES = {"arith": 200, "tools": 100}
FILES = {"arith": "tiny-chat-arith.jsonl", "tools": "tiny-chat-tools.jsonl"}


def rows(kind: str, n: int, seed: int = SEED) -> list[dict[str, Any]]:
    """``n`` held-out rows of ``kind`` (``arith`` or ``tools``), deterministic per seed."""
    rng = random.Random(f"{seed}-{kind}")
    out = []
    for _ in range(n):
        if kind == "arith":
            conv = sample(rng, heldout=True, kind="arith", mode="thinking")
            out.append({"question": conv.messages[0]["content"], "answer": conv.expect["answer"]})
        else:
            conv = sample(rng, heldout=True, kind="tool", mode="chat")
            out.append({"question": conv.messages[0]["content"], "tools": conv.tools,
                        "answer": conv.expect["calls"]})
    return out


def jsonl(kind: str) -> str:
    """The text of one shipped set."""
    return "".join(json.dumps(r) + "\n" for r in rows(kind, SIZES[kind]))


def main(argv: list[str] | None = None) -> int:
    (folder,) = argv if argv is not None else sys.argv[1:]
    for kind, name in FILES.items():
        (Path(folder) / name).write_text(jsonl(kind))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
