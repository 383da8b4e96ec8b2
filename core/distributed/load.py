"""Each rank reads only its slice of every weight from the safetensors shards (``safe_open(...).get_slice``).

The checkpoint is validated first exactly as the single-process loader does (``inspect_layout``: config,
index, every header), then each tensor is read through :func:`~dsa_runtime.distributed.sharding.shard_state`,
which asks only for the rows / columns of this rank. ``bytes_read`` counts the bytes this rank loaded.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsa_runtime.distributed.parallel import RankInfo
from dsa_runtime.distributed.sharding import Reader, shard_state, tensor_bytes

if TYPE_CHECKING:
    from torch import Tensor


@dataclass
class RankCheckpoint:
    """One rank's part of a checkpoint: config, its tensors (HF names), tokenizer (rank 0 only) and
    ``bytes_read`` (sum of the tensor bytes this rank read from disk)."""

    config: Any
    tensors: dict[str, Tensor]
    tokenizer: Any
    path: Path
    bytes_read: int = 0
    extras: dict[str, Any] = field(default_factory=dict)


def load_rank_checkpoint(path: str | Path, info: RankInfo, *, with_tokenizer: bool = True,
                         mtp: bool = False) -> RankCheckpoint:
    """Validate ``path`` and read this rank's slices (``mtp``: the MTP layer's too). Raises the loader's one-line
    ``LoadError``."""
    from safetensors import safe_open

    from dsa_runtime.loader.errors import LoadError
    from dsa_runtime.loader.validate import inspect_layout

    layout = inspect_layout(path)
    entries = {name: e for shard in layout.shards.values() for name, e in shard.entries.items()}
    with contextlib.ExitStack() as stack:
        handles = {file: stack.enter_context(safe_open(str(file), framework="pt", device="cpu"))
                   for file in layout.shards}

        def read(name: str, dim: int | None, start: int, end: int) -> Tensor:
            f = handles[layout.location[name]]
            try:
                if dim is None:
                    return f.get_tensor(name)
                sl = f.get_slice(name)
                return sl[start:end] if dim == 0 else sl[:, start:end]
            except Exception as exc:  # safetensors raises its own error types
                raise LoadError(f"{layout.location[name]}: cannot read tensor {name}: {str(exc).splitlines()[0]}") from None

        reader = Reader(list(entries), lambda n: tuple(entries[n].shape), lambda n: entries[n].dtype == "F8_E4M3", read)
        tensors = shard_state(reader, info, layout.config.num_hidden_layers, mtp=mtp)
    tokenizer = None
    if with_tokenizer and (layout.folder / "tokenizer.json").is_file():
        from dsa_runtime.loader.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(layout.folder)
    return RankCheckpoint(layout.config, tensors, tokenizer, layout.folder, tensor_bytes(tensors))
