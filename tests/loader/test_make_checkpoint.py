"""make_checkpoint / default_model_path / the make-checkpoint CLI: real layout, determinism, atomicity."""

from __future__ import annotations

import hashlib
import json
import threading

import pytest
from safetensors import safe_open

from dsa_runtime.errors import ConfigError
from dsa_runtime.loader import default_model
from dsa_runtime.loader import make_checkpoint as mc
from dsa_runtime.loader.spec import expected_tensors
from dsa_runtime.model.config import ModelConfig


def _digest(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_layout_of_tiny_v32(tiny_v32_dir):
    names = sorted(p.name for p in tiny_v32_dir.iterdir())
    assert names == [
        "config.json", "generation_config.json", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json",
        "tokenizer_config.json",
    ]
    raw = json.loads((tiny_v32_dir / "config.json").read_text())
    assert raw["architectures"] == ["DeepseekV32ForCausalLM"] and raw["model_type"] == "deepseek_v32"
    assert raw["torch_dtype"] == "bfloat16"
    assert raw["quantization_config"] == {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                          "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}
    cfg = ModelConfig.from_hf(raw)
    index = json.loads((tiny_v32_dir / "model.safetensors.index.json").read_text())
    specs = expected_tensors(cfg)
    assert set(index["weight_map"]) == set(specs)
    assert set(index["weight_map"].values()) == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    assert "model.layers.3.eh_proj.weight" in index["weight_map"]  # the MTP layer
    total = 0
    for file in set(index["weight_map"].values()):
        with safe_open(str(tiny_v32_dir / file), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                assert index["weight_map"][name] == file
                t = f.get_tensor(name)
                assert tuple(t.shape) == specs[name].shape
                total += t.numel() * t.element_size()
    assert index["metadata"]["total_size"] == total
    tok_cfg = json.loads((tiny_v32_dir / "tokenizer_config.json").read_text())
    assert tok_cfg["bos_token"]["content"] == "<｜begin▁of▁sentence｜>"
    assert tok_cfg["eos_token"]["content"] == "<｜end▁of▁sentence｜>"
    gen = json.loads((tiny_v32_dir / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["top_p"]) == (0, 1, 0.95)


def test_tiny_v3_three_shards_no_indexer(tiny_v3_dir):
    raw = json.loads((tiny_v3_dir / "config.json").read_text())
    assert raw["architectures"] == ["DeepseekV3ForCausalLM"] and "index_topk" not in raw
    assert "scale_fmt" not in raw["quantization_config"]
    index = json.loads((tiny_v3_dir / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 3
    assert not any("indexer" in n for n in index["weight_map"])


def test_same_inputs_same_bytes(tmp_path, tiny_v32_dir):
    again = mc.make_checkpoint(tmp_path / "again", "tiny-v32", seed=0)
    assert _digest(again) == _digest(tiny_v32_dir)
    other = mc.make_checkpoint(tmp_path / "other", "tiny-v32", seed=7)
    differs = _digest(other)
    assert differs["tokenizer.json"] == _digest(tiny_v32_dir)["tokenizer.json"]
    assert differs["model-00001-of-00002.safetensors"] != _digest(tiny_v32_dir)["model-00001-of-00002.safetensors"]


def test_refuses_non_empty_target_accepts_empty_one(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="already exists"):
        mc.make_checkpoint(tmp_path / "full")
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    (tmp_path / "empty").mkdir()
    assert (mc.make_checkpoint(tmp_path / "empty", "tiny-v3") / "config.json").is_file()
    with pytest.raises(ConfigError, match="unknown preset"):
        mc.make_checkpoint(tmp_path / "x", "tiny-v4")
    with pytest.raises(ConfigError, match="--shards"):
        mc.make_checkpoint(tmp_path / "x", num_shards=0)


def test_failure_leaves_nothing_behind(tmp_path, monkeypatch):
    def boom(folder, tensors, num_shards):
        (folder / "model-00001-of-00002.safetensors").write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(mc, "write_shards", boom)
    with pytest.raises(OSError, match="disk full"):
        mc.make_checkpoint(tmp_path / "ck")
    assert list(tmp_path.iterdir()) == []


def test_cli(tmp_path, capsys):
    from dsa_runtime.cli.main import main

    assert main(["make-checkpoint", str(tmp_path / "c"), "--preset", "tiny-v3", "--seed", "2", "--shards", "4"]) == 0
    assert "wrote tiny-v3 (seed 2)" in capsys.readouterr().out
    index = json.loads((tmp_path / "c" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 4
    assert main(["make-checkpoint", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dsa-runtime: error:") and "already exists" in err and "\n" not in err


def test_random_model_created_once_with_one_notice(tmp_path, monkeypatch, capsys, tiny_v32_dir):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(default_model.random_model_path())) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and len(set(results)) == 1
    path = results[0]
    assert path.parent == tmp_path / "dsa-runtime"
    assert path.name == f"tiny-v32-{default_model.version_hash()}"
    err = capsys.readouterr().err
    assert err.count("creating the random test model") == 1 and err.count("\n") == 1
    assert _digest(path) == _digest(tiny_v32_dir)  # deterministic: preset tiny-v32, seed 0
    assert sorted(p.name for p in path.parent.iterdir() if not p.name.startswith(".")) == [path.name]
    assert not [p for p in path.parent.iterdir() if ".tmp-" in p.name]
    assert default_model.random_model_path() == path
    assert capsys.readouterr().err == ""


def test_cache_root_without_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_model.cache_root() == tmp_path / ".cache" / "dsa-runtime"
