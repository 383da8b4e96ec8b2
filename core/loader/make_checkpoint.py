"""Write a small random checkpoint in exactly the layout of the released DeepSeek V3 / V3.2 checkpoints.

The folder holds ``config.json`` (real key names), ``generation_config.json``, ``model-0000K-of-0000N
.safetensors`` shards with ``model.safetensors.index.json`` (``metadata.total_size``, ``weight_map``), the MTP
layer as ``model.layers.<num_hidden_layers>.*``, ``tokenizer.json`` and ``tokenizer_config.json``. Writing is
atomic: everything goes into a hidden temporary folder next to the target, which is renamed at the end, so a
crash or a concurrent writer never leaves a half-written checkpoint under the target name. The same
(preset, seed, package version) always gives byte-identical files.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsa_runtime.errors import ConfigError
from dsa_runtime.loader.presets import DEFAULT_PRESET, preset_config
from dsa_runtime.loader.tokenizer_train import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, train_tokenizer

if TYPE_CHECKING:
    from torch import Tensor

INDEX_FILE = "model.safetensors.index.json"


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _tokenizer_config(max_len: int) -> dict[str, Any]:
    def added(content: str) -> dict[str, Any]:
        return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": False,
                "rstrip": False, "single_word": False}

    # Like DeepSeek's: no automatic bos/eos (the chat encoder writes bos itself). The generic fast-tokenizer
    # class loads tokenizer.json as it is in transformers.
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": added(BOS_TOKEN),
        "eos_token": added(EOS_TOKEN),
        "pad_token": added(PAD_TOKEN),
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": max_len,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def _generation_config(raw: dict[str, Any]) -> dict[str, Any]:
    return {"_from_model_config": True, "bos_token_id": raw["bos_token_id"], "eos_token_id": raw["eos_token_id"],
            "do_sample": True, "temperature": 1.0, "top_p": 0.95}


def _split(tensors: dict[str, Tensor], num_shards: int) -> list[list[str]]:
    """Contiguous groups of names with about equal bytes (the released checkpoints also cut mid-layer)."""
    sizes = {n: t.numel() * t.element_size() for n, t in tensors.items()}
    total = sum(sizes.values())
    groups: list[list[str]] = [[] for _ in range(num_shards)]
    done = 0
    for name, size in sizes.items():
        k = min(num_shards - 1, done * num_shards // total)
        groups[k].append(name)
        done += size
    if any(not g for g in groups):
        raise ConfigError(f"--shards {num_shards}: too many shards for {len(tensors)} tensors")
    return groups


def write_shards(folder: Path, tensors: dict[str, Tensor], num_shards: int) -> dict[str, str]:
    """Save ``tensors`` as ``num_shards`` safetensors files + the index; returns the weight map."""
    from safetensors.torch import save_file

    weight_map: dict[str, str] = {}
    groups = _split(tensors, num_shards)
    for k, names in enumerate(groups, start=1):
        file = f"model-{k:05d}-of-{num_shards:05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in names}, str(folder / file), metadata={"format": "pt"})
        os.chmod(folder / file, 0o644)  # safetensors creates files owner-only; the cache copy may be shared
        weight_map.update(dict.fromkeys(names, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    _write_json(folder / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    return weight_map


def _preset_tokenizer_json(preset: str, vocab_size: int) -> str:
    """The ``tokenizer.json`` text of a random checkpoint of ``preset``."""
    from dsa_runtime.loader.default_model import EMBEDDED_MODEL, embedded_model_path

    if preset == EMBEDDED_MODEL:
        # Its 3072 ids were trained on the generated chats as well as the shipped corpus: reuse the embedded
        # model's tokenizer (that training's output, byte for byte), so writing a checkpoint needs no chat
        # generator.
        return (embedded_model_path() / "tokenizer.json").read_text(encoding="utf-8")
    return train_tokenizer(vocab_size).to_str(pretty=True) + "\n"


def make_checkpoint(out_dir: str | Path, preset: str = DEFAULT_PRESET, seed: int = 0, *, num_shards: int = 2) -> Path:
    """Create a random checkpoint of ``preset`` (``tiny-v32`` or ``tiny-v3``) at ``out_dir``; returns its path.

    ``out_dir`` must not exist or be an empty folder. Raises ConfigError for an unknown preset, a non-empty
    target, or ``num_shards < 1``; FileExistsError if another writer created the target meanwhile.
    """
    from dsa_runtime.loader.random_init import random_state_dict
    from dsa_runtime.model.config_parse import parse_hf_config

    raw = preset_config(preset)
    if num_shards < 1:
        raise ConfigError(f"--shards must be >= 1, got {num_shards}")
    target = Path(out_dir).expanduser().absolute()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ConfigError(f"{target}: already exists and is not an empty folder")
    config = parse_hf_config(raw)
    tokenizer_json = _preset_tokenizer_json(preset, config.vocab_size)
    tensors = random_state_dict(config, seed=seed)

    write_folder(target, raw, tokenizer_json, tensors, num_shards)
    return target


def write_folder(target: Path, raw: dict[str, Any], tokenizer_json: str, tensors: dict[str, Tensor],
                 num_shards: int) -> None:
    """Write a checkpoint folder at ``target`` (absent or an empty folder) atomically: every file goes into a
    temporary sibling, renamed to ``target`` once complete, so a failed write leaves nothing behind."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        _write_json(tmp / "config.json", raw)
        _write_json(tmp / "generation_config.json", _generation_config(raw))
        (tmp / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
        _write_json(tmp / "tokenizer_config.json", _tokenizer_config(raw["max_position_embeddings"]))
        write_shards(tmp, tensors, num_shards)
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        if target.is_dir():
            target.rmdir()  # empty (checked by the callers); rename cannot replace a folder on every OS
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
