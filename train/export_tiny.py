"""Export a training run's bf16 state (``state-*.safetensors`` + ``tokenizer.json``) as the embedded FP8
checkpoint: ``python train/export_tiny.py RUN_DIR [core/loader/data/tiny-chat]``. A main-model run (no MTP
tensors) is written with ``num_nextn_predict_layers`` 0; ``train/train_nextn.py`` then adds the MTP layer."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from safetensors.torch import load_file

    from dsa_runtime.loader.export import write_checkpoint
    from dsa_runtime.loader.presets import preset_config

    run = Path(argv[0])
    target = Path(argv[1] if len(argv) > 1 else Path(__file__).parents[1] / "core/loader/data/tiny-chat")
    state = {}
    for f in sorted(run.glob("state-*.safetensors")):
        state.update({k: v.float() for k, v in load_file(str(f)).items()})
    tok_json = (run / "tokenizer.json").read_text(encoding="utf-8")
    if target.exists():
        shutil.rmtree(target)
    raw = preset_config("tiny-chat")
    if not any(k.startswith(f"model.layers.{raw['num_hidden_layers']}.") for k in state):
        raw["num_nextn_predict_layers"] = 0
    write_checkpoint(target, raw, state, tok_json, num_shards=2)
    size = sum(f.stat().st_size for f in target.iterdir())
    print(f"wrote {target} ({size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
