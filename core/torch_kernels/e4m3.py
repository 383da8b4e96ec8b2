"""e4m3 -> fp32 through a 256-entry lookup table.

PyTorch's CPU cast from ``float8_e4m3fn`` is a scalar loop (~3 ns an element on the development machine);
an ``index_select`` into a table of the 256 exact fp32 values, NaN codes included, is 5-8x faster and
bit-identical.
"""

from __future__ import annotations

import torch
from torch import Tensor

_TABLES: dict[str, Tensor] = {}


def _table(device: torch.device) -> Tensor:
    key = str(device)
    table = _TABLES.get(key)
    if table is None:
        codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
        table = codes.view(torch.float8_e4m3fn).float().to(device)
        _TABLES[key] = table
    return table


def to_float(x: Tensor) -> Tensor:
    """``x`` e4m3 or its uint8 bytes, any shape -> fp32 of the same shape (exact)."""
    codes = x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x
    if codes.dtype != torch.uint8:
        raise ValueError(f"expected e4m3 or uint8, got {x.dtype}")
    return _table(x.device).index_select(0, codes.reshape(-1).long()).view(x.shape)
