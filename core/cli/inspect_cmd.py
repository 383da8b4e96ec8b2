"""``dsa-runtime inspect DIR_OR_CONFIG``: architecture, parameter count and memory plan of a model.

A checkpoint folder is checked from its headers (nothing is loaded); a ``config.json`` alone (or a preset
name) is built at full size on the ``meta`` device, which allocates no memory even for the 671B models.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HELP = "show a checkpoint's or config.json's architecture, parameters and memory plan (weights, KV per token)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="DIR_OR_CONFIG",
                        help="checkpoint folder, config.json file, or a preset name (tiny-v32, tiny-v3)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--no-build", action="store_true", help="config only: skip the meta-device build")


def _summary(target: str, build: bool):
    from dsa_runtime.errors import ConfigError
    from dsa_runtime.loader.presets import PRESETS, preset_config
    from dsa_runtime.loader.summary import summarize_checkpoint, summarize_config
    from dsa_runtime.loader.validate import INDEX_FILE, read_json
    from dsa_runtime.model.config_parse import parse_hf_config

    path = Path(target).expanduser()
    if not path.exists() and target in PRESETS:
        summary = summarize_config(parse_hf_config(preset_config(target)), build=build)
        summary.source = f"preset {target}"
        return summary
    if path.is_dir() and ((path / INDEX_FILE).exists() or any(path.glob("*.safetensors"))):
        return summarize_checkpoint(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"{path}: no such checkpoint folder or config.json")
    raw = read_json(path)
    try:
        config = parse_hf_config(raw)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("config.json", str(path), 1)) from None
    summary = summarize_config(config, build=build)
    summary.source = str(path)
    return summary


def _fmt_int(n: int) -> str:
    return f"{n:,}"


def render(s) -> str:
    from dsa_runtime.loader.checkpoint import format_bytes

    kv = s.kv
    total_params = s.params_main + s.params_mtp
    dsa = (f"DSA (lightning indexer, index_topk {s.index_topk} of {s.max_position_embeddings:,} positions)"
           if s.index_topk else f"dense MLA ({s.max_position_embeddings:,} positions)")
    lines = [
        f"architecture     {s.architecture}: {dsa}",
        f"source           {s.source}",
        f"layers           {s.dense_layers} dense + {s.moe_layers} MoE + {s.mtp_layers} MTP",
        f"parameters       {_fmt_int(total_params)} ({total_params / 1e9:.2f} B): main {_fmt_int(s.params_main)}"
        f" + MTP {_fmt_int(s.params_mtp)}",
        f"weights          {format_bytes(s.weight_bytes_main + s.weight_bytes_mtp)}: main "
        f"{format_bytes(s.weight_bytes_main)} + MTP {format_bytes(s.weight_bytes_mtp)}; "
        + ", ".join(f"{k} {format_bytes(v)}" for k, v in sorted(s.bytes_by_kind.items()))
        + f"; FP8 scales {s.scale_fmt}",
        f"tensors          {_fmt_int(s.num_tensors)}",
        f"KV cache/token   {kv.layers} layers (main + MTP), per layer: MLA bf16 {kv.mla_bf16} B or FP8 {kv.mla_fp8} B"
        + (f", index-K {kv.index_k} B" if kv.index_k else ""),
        f"                 bf16 layout {_fmt_int(kv.per_token('bf16'))} B/token, "
        f"FP8 layout {_fmt_int(kv.per_token('fp8_656'))} B/token"
        f" ({format_bytes(kv.per_token('fp8_656') * s.max_position_embeddings)} for one"
        f" {s.max_position_embeddings:,}-token sequence)",
    ]
    if s.tokenizer_vocab is not None:
        lines.append(f"tokenizer        {_fmt_int(s.tokenizer_vocab)} tokens")
    if s.meta_build:
        lines.append(f"meta build       {s.meta_build}")
    lines += [f"note             {v}" for v in s.extra.values()]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    summary = _summary(args.target, build=not args.no_build)
    if args.json:
        json.dump(summary.as_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render(summary))
    return 0
