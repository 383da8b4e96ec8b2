"""Write trained HF-named weights as a checkpoint in the released layout (FP8 linears, block scales).

Linears listed as ``fp8`` by :func:`dsa_runtime.loader.spec.expected_tensors` are quantised to e4m3 with
128x128 block scales (the config's ``scale_fmt``); norms, embeddings, ``lm_head`` and the indexer's
``weights_proj`` are bf16, the gate and its correction bias fp32 -- exactly what a real V3.2 checkpoint holds.
Writing is atomic (temporary folder, then one rename). :mod:`~dsa_runtime.loader.make_checkpoint` writes
the same layout from random weights with the same file writers; the training scripts (``train/``) export
their runs with this module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dsa_runtime.loader.make_checkpoint import write_folder


def quantize_state(raw_config: dict[str, Any], state: dict, *, fp8: bool = True) -> dict:
    """HF-named fp32/bf16 tensors -> the checkpoint's tensors (order of ``expected_tensors``; an MTP layer's
    copies of the embedding and head are written only when ``state`` has them)."""
    import torch

    from dsa_runtime.loader.spec import expected_tensors, is_shared_copy
    from dsa_runtime.model.config_parse import parse_hf_config
    from dsa_runtime.reference.fp8 import block_quant_weight

    config = parse_hf_config(raw_config)
    out = {}
    for name, spec in expected_tensors(config, fp8=fp8).items():
        if name.endswith("_scale_inv") or (name not in state and is_shared_copy(name, config)):
            continue
        w = state[name].detach().float().cpu()
        if tuple(w.shape) != tuple(spec.shape):
            raise ValueError(f"{name}: shape {tuple(w.shape)}, expected {tuple(spec.shape)}")
        if spec.kind == "fp8":
            out[name], out[f"{name}_scale_inv"] = block_quant_weight(w, config.scale_fmt)
        elif spec.kind == "fp32":
            out[name] = w
        else:
            out[name] = w.to(torch.bfloat16)
    return out


def write_checkpoint(out_dir: str | Path, raw_config: dict[str, Any], state: dict, tokenizer_json: str, *,
                     num_shards: int = 2, fp8: bool = True) -> Path:
    """Create the checkpoint folder ``out_dir`` (must not exist); returns its path."""
    target = Path(out_dir).absolute()
    if target.exists():
        raise FileExistsError(f"{target}: already exists")
    raw = dict(raw_config)
    if not fp8:
        raw.pop("quantization_config", None)
    tensors = quantize_state(raw, state, fp8=fp8)
    write_folder(target, raw, tokenizer_json, tensors, num_shards)
    return target


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))
