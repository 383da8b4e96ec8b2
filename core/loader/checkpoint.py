"""Load a DeepSeek V3 / V3.2 safetensors checkpoint: validated first, then shard by shard with a progress bar.

FP8 e4m3 weights are kept as they are, next to their fp32 ``weight_scale_inv`` multipliers (the model decides
what to dequantize); the MTP layers (``model.layers.<num_hidden_layers>..``) are kept aside in
``mtp_tensors``. Before any data is read the loader states how many bytes it is about to load.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsa_runtime.loader.errors import LoadError
from dsa_runtime.loader.spec import is_mtp_tensor
from dsa_runtime.loader.validate import CheckpointLayout, inspect_layout
from dsa_runtime.model.config import ModelConfig

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from dsa_runtime.loader.tokenizer import Tokenizer

log = logging.getLogger(__name__)


def format_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KiB``; binary units up to TiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@dataclass
class Checkpoint:
    """A loaded checkpoint.

    Attributes:
        config: parsed ``config.json``; raw_config: the dict as read.
        tensors: main-stack tensors by HF name (FP8 weights as ``float8_e4m3fn`` with their
            ``<name>_scale_inv`` fp32 tensors; bf16 / fp32 otherwise), on ``device``.
        mtp_tensors: the MTP layers' tensors (``model.layers.N.*``, N >= num_hidden_layers); empty if absent.
        tokenizer: from ``tokenizer.json`` (None when the folder has none).
        path: the checkpoint folder.
    """

    config: ModelConfig
    tensors: dict[str, Tensor]
    mtp_tensors: dict[str, Tensor]
    tokenizer: Tokenizer | None
    path: Path
    raw_config: dict[str, Any] = field(default_factory=dict, repr=False)

    def all_tensors(self) -> dict[str, Tensor]:
        """The main stack's tensors and the MTP layers' in one dict (what a runner with its draft layer loads)."""
        return {**self.tensors, **self.mtp_tensors}

    def dequantized(self, name: str) -> Tensor:
        """fp32 value of weight ``name`` (``W[i, j] = W8[i, j] * S[i // 128, j // 128]`` when FP8)."""
        import torch

        from dsa_runtime.reference.fp8 import block_dequant_weight

        source = self.mtp_tensors if name in self.mtp_tensors else self.tensors
        w = source[name]
        if w.dtype == torch.float8_e4m3fn:
            return block_dequant_weight(w, source[f"{name}_scale_inv"])
        return w.float()


def _available_memory() -> int | None:
    """Free host memory in bytes (Linux), for the pre-load warning; None where unknown."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _announce(layout: CheckpointLayout, device: str, progress: bool) -> None:
    total, mtp = layout.nbytes(), layout.nbytes(mtp=True)
    msg = (
        f"loading {format_bytes(total)} of weights (main {format_bytes(total - mtp)}, MTP {format_bytes(mtp)}) "
        f"from {len(layout.shards)} shard(s) in {layout.folder} onto {device}"
    )
    log.info(msg)
    if progress:
        print(f"dsa-runtime: {msg}", file=sys.stderr)
    free = _available_memory()
    if str(device).startswith("cpu") and free is not None and total > free:
        log.warning("the checkpoint needs %s but only %s of memory is free", format_bytes(total), format_bytes(free))


def _read_shard(file: Path, names: list[str], device: torch.device) -> dict[str, Tensor]:
    from safetensors import SafetensorError, safe_open

    out: dict[str, Tensor] = {}
    name = "(header)"
    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in names:
                t = f.get_tensor(name)
                out[name] = t if device.type == "cpu" else t.to(device)
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise LoadError(f"{file}: cannot read tensor {name}: {str(exc).splitlines()[0]}") from None
    return out


def load_checkpoint(path: str | Path, *, device: str | torch.device = "cpu", progress: bool = True) -> Checkpoint:
    """Validate and load the checkpoint at ``path`` (folder with shards + index, folder, or one file).

    Raises LoadError (a ConfigError) with one line naming the file and tensor for bad JSON, a bad config,
    missing / unexpected tensors, wrong shapes or dtypes, and truncated or corrupt shards.
    """
    import torch
    from tqdm import tqdm

    from dsa_runtime.loader.tokenizer import load_tokenizer

    dev = torch.device(device)
    layout = inspect_layout(path)
    _announce(layout, str(dev), progress)
    tensors: dict[str, Tensor] = {}
    mtp: dict[str, Tensor] = {}
    bar = tqdm(layout.shards.items(), total=len(layout.shards), unit="shard", desc="Loading checkpoint",
               disable=not progress, file=sys.stderr)
    for file, shard in bar:
        for name, t in _read_shard(file, list(shard.entries), dev).items():
            (mtp if is_mtp_tensor(name, layout.config) else tensors)[name] = t
    tokenizer = None
    if (layout.folder / "tokenizer.json").is_file():
        tokenizer = load_tokenizer(layout.folder)
    else:
        log.warning("%s: no tokenizer.json; token ids only", layout.folder)
    return Checkpoint(layout.config, tensors, mtp, tokenizer, layout.folder, layout.raw_config)
