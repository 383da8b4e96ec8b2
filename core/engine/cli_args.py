"""Dataclass fields <-> argparse options, driven by each field's metadata.

``metadata``: ``flag`` (default ``--field-name``), ``help``, optional ``aliases`` (extra spellings) and
``choices``, ``nargs``. Types come from the field annotation (``int``, ``float``, ``str``, ``bool``, ``list[int]``
with ``nargs``, ``X | None``).
Options default to ``argparse.SUPPRESS``, so :func:`config_from_args` only passes what the user gave and the
dataclass keeps its own defaults (one source of truth).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import MISSING, fields
from typing import Any, TypeVar

T = TypeVar("T")
_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def _base_type(annotation: Any) -> type:
    """The argparse type of an annotation; ``list[int]`` gives ``int`` (the field's ``nargs`` takes the list)."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    parts = [p.strip() for p in text.split("|") if p.strip() != "None"]
    if len(parts) == 1 and parts[0].startswith("list[") and parts[0].endswith("]"):
        parts = [parts[0][5:-1]]
    if len(parts) != 1 or parts[0] not in _TYPES:
        raise TypeError(f"unsupported option type {text!r}")
    return _TYPES[parts[0]]


def add_dataclass_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, exclude: Iterable[str] = ()
) -> None:
    """Add one option per field of dataclass ``cls`` (minus ``exclude``)."""
    skip = set(exclude)
    for f in fields(cls):
        if f.name in skip:
            continue
        meta = f.metadata
        flags = [meta.get("flag", "--" + f.name.replace("_", "-")), *meta.get("aliases", [])]
        kind = _base_type(f.type)
        default = f.default if f.default is not MISSING else None
        help_text = meta.get("help", "")
        if default is not None and kind is not bool and "default" not in help_text:
            help_text = f"{help_text} (default: {default})"
        kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": help_text}
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = kind
            if "nargs" in meta:
                kwargs["nargs"] = meta["nargs"]
            if "choices" in meta:
                kwargs["choices"] = list(meta["choices"])  # argparse shows them as the metavar
            else:
                kwargs["metavar"] = meta.get("metavar", f.name.upper())
        parser.add_argument(*flags, **kwargs)


def config_from_args(args: argparse.Namespace, cls: type[T], **overrides: Any) -> T:
    """Build ``cls`` from the options the user gave (others keep the dataclass defaults)."""
    values = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}  # type: ignore[arg-type]
    values.update(overrides)
    return cls(**values)
