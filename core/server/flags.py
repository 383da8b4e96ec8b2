"""Command-line flags generated from config dataclasses: one dataclass field is one flag.

A field's metadata may carry ``help``, ``flag`` (the spelling, default ``--field-name``) and ``aliases``
(older spellings that set the same field). ``bool`` fields become ``--flag / --no-flag``; ``X | None``
fields accept ``X`` and default to ``None``; a ``choices`` entry in the metadata restricts the values.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")

_SCALARS = (int, float, str)


def _scalar_type(annotation: Any) -> type | None:
    """``int`` for ``int`` / ``int | None`` / ``Optional[int]``; None for anything else (lists, unions)."""
    if annotation in _SCALARS or annotation is bool:
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and args[0] in _SCALARS:
            return args[0]
    return None


def dataclass_flags(cls: type, extra_aliases: Mapping[str, Iterable[str]] | None = None) -> dict[str, list[str]]:
    """Field name -> its option strings (primary flag first), for the fields that have a flag."""
    hints = typing.get_type_hints(cls)
    out: dict[str, list[str]] = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.metadata.get("flag") is False or _scalar_type(hints[f.name]) is None:
            continue
        primary = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        names = [primary, *f.metadata.get("aliases", ())]
        names += [a for a in (extra_aliases or {}).get(f.name, ()) if a not in names]
        out[f.name] = names
    return out


def add_dataclass_arguments(
    parser: argparse.ArgumentParser | Any,
    cls: type,
    *,
    extra_aliases: Mapping[str, Iterable[str]] | None = None,
    skip: Iterable[str] = (),
) -> None:
    """Add one option per flagged field of dataclass ``cls`` (defaults: the dataclass defaults)."""
    hints = typing.get_type_hints(cls)
    skipped = set(skip)
    flags = dataclass_flags(cls, extra_aliases)
    for f in dataclasses.fields(cls):
        if f.name not in flags or f.name in skipped:
            continue
        kind = _scalar_type(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = f.metadata.get("help", "")
        kwargs: dict[str, Any] = {"dest": f.name, "default": default}
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = kind
            kwargs["metavar"] = f.metadata.get("metavar", f.name.upper())
            if "choices" in f.metadata:
                kwargs["choices"] = list(f.metadata["choices"])
        kwargs["help"] = help_text if "default" in help_text else f"{help_text} (default: {default})".lstrip()
        parser.add_argument(*flags[f.name], **kwargs)


def config_from_args(args: argparse.Namespace, cls: type[T], **overrides: Any) -> T:
    """Build ``cls`` from the parsed flags of its fields (fields without a flag keep their defaults)."""
    values = {
        f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.init and hasattr(args, f.name)
    }
    values.update(overrides)
    return cls(**values)
