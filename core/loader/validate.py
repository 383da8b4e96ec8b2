"""Find a checkpoint's files and check every tensor against :func:`expected_tensors` before loading.

Accepted layouts: a folder with shards and ``model.safetensors.index.json``; a folder with safetensors files
and no index (headers say which file holds what); one ``.safetensors`` file (its folder holds
``config.json``). Problems raise one :class:`LoadError` line naming the tensor and the file; when there are
several, the first is shown with a count of the rest.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsa_runtime.errors import ConfigError
from dsa_runtime.loader.errors import LoadError
from dsa_runtime.loader.safetensors_header import HeaderEntry, ShardHeader, read_header
from dsa_runtime.loader.spec import TensorSpec, expected_tensors, is_mtp_tensor, is_shared_copy
from dsa_runtime.model.config import ModelConfig

log = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
ALLOWED_DTYPES: dict[str, tuple[str, ...]] = {
    "fp8": ("F8_E4M3",),
    "bf16": ("BF16", "F32"),
    "fp32": ("F32",),
    "norm": ("BF16", "F32"),
}


@dataclass
class CheckpointLayout:
    """Where each tensor lives, checked against the config (no tensor data read yet)."""

    folder: Path
    raw_config: dict[str, Any]
    config: ModelConfig
    shards: dict[Path, ShardHeader]  # in load order
    location: dict[str, Path]  # tensor name -> shard file
    has_mtp: bool

    def nbytes(self, *, mtp: bool | None = None) -> int:
        """Bytes of all tensors (``mtp=None``), of the main stack (False) or of the MTP layers (True)."""
        total = 0
        for shard in self.shards.values():
            for name, e in shard.entries.items():
                if mtp is None or is_mtp_tensor(name, self.config) == mtp:
                    total += e.nbytes
        return total


def read_json(path: Path) -> Any:
    """JSON of ``path``; LoadError with the file, line and column for a missing, unreadable or bad file."""
    if not path.is_file():
        raise LoadError(f"{path}: missing")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise LoadError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LoadError(f"{path}: cannot read: {exc}") from None


def _weight_map(folder: Path) -> dict[str, Path] | None:
    index_path = folder / INDEX_FILE
    if not index_path.exists():
        return None
    index = read_json(index_path)
    wm = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
        raise LoadError(f"{index_path}: no 'weight_map' object of tensor name -> file name")
    out: dict[str, Path] = {}
    for name, file in wm.items():
        if Path(file).name != file:
            raise LoadError(f"{index_path}: tensor {name} maps to {file!r}, not a file of this folder")
        out[name] = folder / file
    return out


def _files(path: Path) -> tuple[Path, list[Path], dict[str, Path] | None]:
    """(folder, shard files in order, index weight map or None)."""
    if path.is_file():
        if path.suffix != ".safetensors":
            raise LoadError(f"{path}: expected a checkpoint folder or a .safetensors file")
        return path.parent, [path], None
    if not path.is_dir():
        raise LoadError(f"{path}: no such checkpoint folder or file")
    wm = _weight_map(path)
    if wm is not None:
        files = sorted(set(wm.values()))
        for file in files:
            if not file.is_file():
                first = next(n for n, f in wm.items() if f == file)
                raise LoadError(f"{file}: missing (listed in {INDEX_FILE} for tensor {first})")
        return path, files, wm
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise LoadError(f"{path}: no .safetensors files and no {INDEX_FILE}")
    return path, files, None


def _locate(shards: dict[Path, ShardHeader], wm: dict[str, Path] | None, folder: Path) -> dict[str, Path]:
    location: dict[str, Path] = {}
    for file, shard in shards.items():
        for name in shard.entries:
            if name in location:
                raise LoadError(f"{file}: tensor {name} is also in {location[name].name}")
            if wm is not None and wm.get(name) != file:
                raise LoadError(f"{file}: tensor {name} is not listed for this file in {INDEX_FILE}")
            location[name] = file
    if wm is not None:
        for name, file in wm.items():
            if name not in location:
                raise LoadError(f"{file}: tensor {name} is listed in {INDEX_FILE} but not in the file")
    return location


def _dtype_problem(name: str, entry: HeaderEntry, spec: TensorSpec, config: ModelConfig) -> str | None:
    allowed = ALLOWED_DTYPES[spec.kind]
    if entry.dtype in allowed:
        return None
    if entry.dtype == "F8_E4M3" and config.quantization is None:
        return f"tensor {name} is F8_E4M3 but config.json has no quantization_config"
    if spec.kind == "fp8" and entry.dtype in ("BF16", "F32"):
        return f"tensor {name} is {entry.dtype} but config.json's quantization_config says FP8 e4m3"
    return f"tensor {name} is {entry.dtype}; expected {' or '.join(allowed)}"


def check_tensors(config: ModelConfig, shards: dict[Path, ShardHeader], location: dict[str, Path],
                  folder: Path) -> bool:
    """Compare the headers with :func:`expected_tensors`; returns whether the MTP layers are present.

    A checkpoint without any MTP tensor is accepted (many conversions drop layer N) with a warning;
    a partial MTP layer is an error like any other missing tensor, except the MTP layer's copies of the
    embedding and head (:func:`~dsa_runtime.loader.spec.is_shared_copy`), which may be omitted.
    """
    specs = expected_tensors(config)
    problems: list[str] = []
    unexpected: list[str] = []  # reported after shape/dtype problems, which usually explain them
    for name, file in location.items():
        spec = specs.get(name)
        entry = shards[file].entries[name]
        if spec is None:
            unexpected.append(f"{file}: unexpected tensor {name} (not part of a {config.architecture} with this config.json)")
        elif entry.shape != spec.shape:
            problems.append(
                f"{file}: tensor {name} has shape {list(entry.shape)} but config.json implies {list(spec.shape)}"
            )
        else:
            problem = _dtype_problem(name, entry, spec, config)
            if problem:
                problems.append(f"{file}: {problem}")
    missing = [n for n in specs if n not in location and not is_shared_copy(n, config)]
    mtp_missing = [n for n in missing if is_mtp_tensor(n, config)]
    mtp_total = sum(1 for n in specs if is_mtp_tensor(n, config) and not is_shared_copy(n, config))
    has_mtp = mtp_total > 0 and len(mtp_missing) < mtp_total
    if mtp_total and not has_mtp:
        log.warning("%s: no MTP layer (num_nextn_predict_layers=%d); speculative decoding is unavailable",
                    folder, config.num_nextn_predict_layers)
        missing = [n for n in missing if not is_mtp_tensor(n, config)]
    where = INDEX_FILE if (folder / INDEX_FILE).exists() else "any .safetensors file"
    problems += unexpected
    problems += [f"{folder}: tensor {n} is missing (not in {where})" for n in missing]
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise LoadError(problems[0] + more)
    return has_mtp


def inspect_layout(path: str | Path) -> CheckpointLayout:
    """Read config.json, the index and every shard header of ``path`` and check them; no tensor is loaded."""
    from dsa_runtime.model.config_parse import parse_hf_config

    path = Path(path).expanduser()
    if not path.exists():
        raise LoadError(f"{path}: no such checkpoint folder or file")
    folder = path.parent if path.is_file() else path
    raw = read_json(folder / "config.json")  # config problems first: they explain most tensor problems
    try:
        config = parse_hf_config(raw)
    except ConfigError as exc:  # name the actual file, not just "config.json"
        raise LoadError(str(exc).replace("config.json", str(folder / "config.json"), 1)) from None
    folder, files, wm = _files(path)
    shards = {file: read_header(file) for file in files}
    location = _locate(shards, wm, folder)
    has_mtp = check_tensors(config, shards, location, folder)
    return CheckpointLayout(folder, raw, config, shards, location, has_mtp)
