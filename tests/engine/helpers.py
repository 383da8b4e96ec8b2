"""Helpers shared by the engine tests: toy-runner engines, random prompts, stepping to the end."""

from __future__ import annotations

import random

from dsa_runtime.engine import Engine, EngineConfig
from tests.engine.fakes import make_parts


def run_all(engine: Engine, max_steps: int = 10_000) -> dict[str, list]:
    """Step until idle; every output per request id, in order."""
    seen: dict[str, list] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return seen
        for out in engine.step():
            seen.setdefault(out.request_id, []).append(out)
    raise AssertionError("engine did not finish")


def make_engine(config: EngineConfig | None = None, **parts_kwargs) -> Engine:
    return Engine(config or EngineConfig(), parts=make_parts(**parts_kwargs))


def random_prompts(n: int, seed: int, lo: int = 1, hi: int = 40, vocab: int = 260) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]
