"""Random JSON schemas for structured-output tests and benches: nested objects, enums, bounded arrays, bounded
numbers, booleans and short strings, every value bounded so that a sampled output can always finish."""

from __future__ import annotations

import random
from typing import Any

_ENUM = ["red", "green", "blue", "cyan", "amber", "ok", "no"]
_NAMES = ["id", "name", "size", "tags", "ok", "price", "items", "meta"]


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """One schema node; objects nest at most two levels deep."""
    kinds = ["integer", "number", "enum", "string", "boolean", "array"] + (["object"] * 2 if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 500)}
    if kind == "number":
        return {"type": "number", "minimum": 0, "maximum": rng.choice([1, 10, 1000])}
    if kind == "enum":
        return {"enum": rng.sample(_ENUM, rng.randint(1, 4))}
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 10)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "array":
        return {"type": "array", "items": random_schema(rng, depth + 1), "maxItems": rng.randint(1, 3)}
    names = rng.sample(_NAMES, rng.randint(1, 4))
    return {"type": "object", "properties": {n: random_schema(rng, depth + 1) for n in names}, "required": names,
            "additionalProperties": False}


def random_object_schemas(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` schemas whose root is an object (what ``response_format: json_schema`` asks for)."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    while len(out) < n:
        schema = random_schema(rng)
        if schema.get("type") == "object":
            out.append(schema)
    return out
