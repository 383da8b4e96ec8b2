"""Shared fixtures of the parser tests: the golden V3.2 encoding data in ``tests/parsers/golden``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# Inside the repository, so every checkout (CI, a fresh clone, a GPU host) runs the golden tests.
GOLDEN_DIR = Path(__file__).resolve().parent / "golden"


@pytest.fixture
def golden_files() -> tuple[Path, str]:
    """(path of the golden input JSON, expected prompt with surrounding whitespace stripped)."""
    src = GOLDEN_DIR / "dsv32_encoding_input.json"
    return src, (GOLDEN_DIR / "dsv32_encoding_output.txt").read_text(encoding="utf-8").strip()


@pytest.fixture
def golden(golden_files) -> tuple[dict, str]:
    """(input with tools attached to messages[0] as the official check does, expected prompt)."""
    src, expected = golden_files
    data = json.loads(src.read_text(encoding="utf-8"))
    data["messages"][0]["tools"] = data["tools"]
    return data, expected


@pytest.fixture
def golden_messages(golden) -> list[dict]:
    return golden[0]["messages"]
