"""Hugging Face ``transformers`` baseline for ``bench/engine_cpu.py`` (optional; one reason when unusable).

transformers loads FP8 checkpoints only through ``accelerate`` and GPU kernels, so the CPU baseline runs a
bf16 copy of the same checkpoint: every FP8 weight dequantised with its ``weight_scale_inv`` (exactly the
values our engine computes with), the MTP layer left out (HF does not run it), ``quantization_config`` removed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

HF_CLASSES = {
    "DeepseekV32ForCausalLM": "DeepseekV32ForCausalLM",
    "DeepseekV3ForCausalLM": "DeepseekV3ForCausalLM",
}


def write_bf16_copy(checkpoint_dir: Path, out_dir: Path) -> Path:
    """A bf16, unquantised copy of ``checkpoint_dir`` (one safetensors file) for transformers."""
    import torch
    from safetensors.torch import save_file

    from dsa_runtime.loader import load_checkpoint
    from dsa_runtime.reference.fp8 import block_dequant_weight

    ckpt = load_checkpoint(checkpoint_dir, progress=False)
    out: dict[str, Any] = {}
    for name, t in ckpt.tensors.items():
        if name.endswith("_scale_inv"):
            continue
        if t.dtype == torch.float8_e4m3fn:
            t = block_dequant_weight(t, ckpt.tensors[name + "_scale_inv"])
        out[name] = t.to(torch.bfloat16).contiguous() if t.is_floating_point() else t.contiguous()
    config = json.loads((checkpoint_dir / "config.json").read_text())
    config.pop("quantization_config", None)
    config["num_nextn_predict_layers"] = 0
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "model.safetensors.tmp"
    save_file(out, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out_dir / "model.safetensors")
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return out_dir


def load_hf(checkpoint_dir: Path, work_dir: Path) -> tuple[Any | None, str]:
    """``(model, "")`` or ``(None, reason)``."""
    try:
        import torch
        import transformers
    except ImportError as exc:
        return None, f"transformers not installed ({exc.name})"
    arch = json.loads((checkpoint_dir / "config.json").read_text())["architectures"][0]
    cls = getattr(transformers, HF_CLASSES.get(arch, arch), None)
    if cls is None:
        return None, f"transformers {transformers.__version__} has no {arch}"
    try:
        copy = write_bf16_copy(checkpoint_dir, work_dir / "hf-bf16")
        model = cls.from_pretrained(copy, dtype=torch.bfloat16)
    except Exception as exc:  # any load failure is reported, not fatal: the column is then skipped
        return (
            None,
            f"{arch} cannot load the checkpoint: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}",
        )
    model.eval()
    return model, ""


def hf_run(model: Any, prompts: list[list[int]], gen_tokens: int) -> dict[str, Any]:
    """Greedy generation of a batch of equal-length prompts: prefill = the 1-token call, decode = the rest."""
    import torch

    ids = torch.tensor(prompts)
    mask = torch.ones_like(ids)
    kwargs = {"do_sample": False, "attention_mask": mask, "pad_token_id": 2, "eos_token_id": None}
    with torch.inference_mode():
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kwargs)
        t1 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=1 + gen_tokens, min_new_tokens=1 + gen_tokens, **kwargs)
        t2 = time.perf_counter()
    prefill_s = t1 - t0
    decode_s = max((t2 - t1) - prefill_s, 1e-9)
    return {
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "tokens": out[:, ids.shape[1] :].tolist(),
    }
