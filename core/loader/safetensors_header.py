"""Read and check a ``.safetensors`` header without touching the tensor data.

File layout: 8-byte little-endian header length ``n``, ``n`` bytes of JSON ``{name: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__": {...}}``, then the data (offsets relative to its start).
Checking the header against the file size finds truncated and corrupt shards up front, with the file and
tensor named, before any byte is loaded; it also lets ``inspect`` size a checkpoint from headers alone.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

from dsa_runtime.loader.errors import LoadError

DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the format's own limit


@dataclass(frozen=True)
class HeaderEntry:
    """One tensor of a shard: safetensors dtype string, shape, and byte size."""

    dtype: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass
class ShardHeader:
    path: Path
    entries: dict[str, HeaderEntry] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())


def _bad(path: Path, msg: str) -> LoadError:
    return LoadError(f"{path}: {msg}")


def _entry(path: Path, name: str, info: object) -> tuple[HeaderEntry, int, int]:
    if not isinstance(info, dict):
        raise _bad(path, f"corrupt header: tensor {name} has no dtype/shape/data_offsets object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise _bad(path, f"tensor {name}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise _bad(path, f"corrupt header: tensor {name} has shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise _bad(path, f"corrupt header: tensor {name} has data_offsets {offsets!r}")
    numel = 1
    for d in shape:
        numel *= d
    need = numel * DTYPE_BYTES[dtype]
    if offsets[1] - offsets[0] != need:
        raise _bad(
            path, f"corrupt header: tensor {name} ({dtype} {shape}) needs {need} bytes but its data_offsets "
            f"cover {offsets[1] - offsets[0]}"
        )
    return HeaderEntry(dtype, tuple(shape), need), offsets[0], offsets[1]


def read_header(path: str | Path) -> ShardHeader:
    """Parse and check the header of ``path``; LoadError names the file (and tensor) for any problem."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise _bad(path, f"truncated: {size} bytes, too short for a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES:
                raise _bad(path, f"corrupt: header length {n} is not plausible (not a safetensors file?)")
            if 8 + n > size:
                raise _bad(path, f"truncated: the header needs {8 + n} bytes but the file has {size}")
            raw = fh.read(n)
    except OSError as exc:
        raise _bad(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise _bad(path, "corrupt: the header is not valid JSON (not a safetensors file?)") from None
    if not isinstance(header, dict):
        raise _bad(path, "corrupt: the header is not a JSON object")
    shard = ShardHeader(path)
    meta = header.pop("__metadata__", None) or {}
    shard.metadata = {str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) else {}
    data_size = size - 8 - n
    for name, info in header.items():
        entry, _, end = _entry(path, name, info)
        if end > data_size:
            raise _bad(
                path, f"truncated: tensor {name} needs data up to byte {8 + n + end} but the file ends at {size}"
            )
        shard.entries[name] = entry
    return shard
