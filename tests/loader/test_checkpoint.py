"""load_checkpoint: the generated layouts load exactly; each corrupted case gives its one-line error."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from dsa_runtime.errors import ConfigError
from dsa_runtime.loader.checkpoint import format_bytes, load_checkpoint
from dsa_runtime.loader.errors import LoadError
from dsa_runtime.loader.random_init import random_state_dict
from dsa_runtime.loader.spec import expected_tensors

INDEX = "model.safetensors.index.json"
SHARD1 = "model-00001-of-00002.safetensors"
KV_A = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"


@pytest.fixture
def ck(tmp_path, tiny_v32_dir):
    """A private copy of the tiny-v32 checkpoint to corrupt."""
    return shutil.copytree(tiny_v32_dir, tmp_path / "ck")


def _edit_shard(folder, file, edit):
    """Rewrite one shard through ``edit(dict)`` and keep the index in step with it."""
    tensors = load_file(str(folder / file))
    edit(tensors)
    save_file(tensors, str(folder / file), metadata={"format": "pt"})
    index = json.loads((folder / INDEX).read_text())
    wm = {n: f for n, f in index["weight_map"].items() if f != file}
    wm.update(dict.fromkeys(tensors, file))
    index["weight_map"] = wm
    (folder / INDEX).write_text(json.dumps(index))


def _shard_of(folder, name):
    return json.loads((folder / INDEX).read_text())["weight_map"][name]


def _load_error(path) -> str:
    with pytest.raises(LoadError) as info:
        load_checkpoint(path, progress=False)
    msg = str(info.value)
    assert "\n" not in msg and isinstance(info.value, ConfigError)
    return msg


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def test_loads_exactly_what_was_generated(tiny_v32_dir):
    ckpt = load_checkpoint(tiny_v32_dir, progress=False)
    cfg = ckpt.config
    assert cfg.is_dsa and ckpt.path == tiny_v32_dir
    specs = expected_tensors(cfg)
    assert set(ckpt.tensors) | set(ckpt.mtp_tensors) == set(specs)
    assert all(n.startswith("model.layers.3.") for n in ckpt.mtp_tensors)
    assert "model.layers.3.eh_proj.weight" in ckpt.mtp_tensors and "model.layers.3.eh_proj.weight" not in ckpt.tensors
    assert ckpt.tensors[KV_A].dtype == torch.float8_e4m3fn
    assert ckpt.tensors[f"{KV_A}_scale_inv"].dtype == torch.float32
    original = random_state_dict(cfg, seed=0)
    for name, t in {**ckpt.tensors, **ckpt.mtp_tensors}.items():
        assert t.dtype == original[name].dtype and torch.equal(_bits(t), _bits(original[name])), name
    assert ckpt.tokenizer is not None and ckpt.tokenizer.eos_id == cfg.eos_token_id


def test_fp8_dequantisation_is_exactly_the_spec_with_partial_blocks(tiny_v32_dir):
    ckpt = load_checkpoint(tiny_v32_dir, progress=False)
    w8, s = ckpt.tensors[KV_A], ckpt.tensors[f"{KV_A}_scale_inv"]
    assert tuple(w8.shape) == (576, 256) and tuple(s.shape) == (5, 2)  # rows 512..575: a partial block
    i = torch.arange(576).unsqueeze(1) // 128
    j = torch.arange(256).unsqueeze(0) // 128
    expected = w8.float() * s[i, j]  # W[i, j] = W8[i, j] * S[i // 128, j // 128], written out
    got = ckpt.dequantized(KV_A)
    assert torch.equal(got, expected)
    assert torch.equal(got[512:], w8[512:].float() * s[4].repeat_interleave(128)[None, :256])
    # the dequantized weight is close to a 1/sqrt(fan_in) matrix, not garbage
    assert 0.04 < got.std().item() < 0.09
    plain = "model.layers.3.shared_head.head.weight"
    assert torch.equal(ckpt.dequantized(plain), ckpt.mtp_tensors[plain].float())


def test_v3_three_shards(tiny_v3_dir):
    ckpt = load_checkpoint(tiny_v3_dir, progress=False)
    assert not ckpt.config.is_dsa and not any("indexer" in n for n in ckpt.tensors)
    assert len(ckpt.mtp_tensors) > 0


def test_memory_estimate_and_progress_go_to_stderr(tiny_v32_dir, capsys, caplog):
    with caplog.at_level(logging.INFO, logger="dsa_runtime.loader.checkpoint"):
        load_checkpoint(tiny_v32_dir, progress=True)
    err = capsys.readouterr().err
    assert "dsa-runtime: loading 7.8 MiB of weights (main 5.0 MiB, MTP 2.7 MiB) from 2 shard(s)" in err
    assert "Loading checkpoint" in err
    assert any("loading 7.8 MiB" in r.message for r in caplog.records)
    load_checkpoint(tiny_v32_dir, progress=False)
    assert capsys.readouterr().err == ""


def test_single_file_and_folder_without_index(tmp_path, tiny_v32_dir):
    everything = {}
    for f in (SHARD1, "model-00002-of-00002.safetensors"):
        everything.update(load_file(str(tiny_v32_dir / f)))
    one = tmp_path / "one"
    one.mkdir()
    shutil.copy(tiny_v32_dir / "config.json", one)
    save_file(everything, str(one / "model.safetensors"))
    a = load_checkpoint(one / "model.safetensors", progress=False)
    b = load_checkpoint(one, progress=False)
    assert set(a.tensors) == set(b.tensors) and len(a.mtp_tensors) == len(b.mtp_tensors) > 0
    assert a.tokenizer is None
    # several files, no index: the headers say where each tensor is
    two = shutil.copytree(tiny_v32_dir, tmp_path / "two")
    (two / INDEX).unlink()
    assert len(load_checkpoint(two, progress=False).tensors) == len(a.tensors)


def test_truncated_shard(ck):
    data = (ck / SHARD1).read_bytes()
    (ck / SHARD1).write_bytes(data[:-1000])
    msg = _load_error(ck)
    assert msg.startswith(f"{ck / SHARD1}: truncated: tensor ") and "needs data up to byte" in msg


def test_shard_cut_inside_its_header(ck):
    (ck / SHARD1).write_bytes((ck / SHARD1).read_bytes()[:100])
    assert _load_error(ck).startswith(f"{ck / SHARD1}: truncated: the header needs")
    (ck / SHARD1).write_bytes(b"\x01\x02")
    assert "too short for a safetensors header" in _load_error(ck)


def test_corrupt_header(ck):
    data = bytearray((ck / SHARD1).read_bytes())
    data[8:40] = b"\xff" * 32
    (ck / SHARD1).write_bytes(bytes(data))
    assert _load_error(ck) == f"{ck / SHARD1}: corrupt: the header is not valid JSON (not a safetensors file?)"
    (ck / SHARD1).write_bytes(b"\xff" * 64)
    assert "header length" in _load_error(ck)


def test_missing_tensor(ck):
    name = "model.layers.1.self_attn.kv_b_proj.weight_scale_inv"
    _edit_shard(ck, _shard_of(ck, name), lambda t: t.pop(name))
    assert _load_error(ck) == f"{ck}: tensor {name} is missing (not in {INDEX})"


def test_tensor_in_index_but_not_in_shard(ck):
    name = "model.layers.0.input_layernorm.weight"
    file = _shard_of(ck, name)
    tensors = load_file(str(ck / file))
    del tensors[name]
    save_file(tensors, str(ck / file))
    assert _load_error(ck) == f"{ck / file}: tensor {name} is listed in {INDEX} but not in the file"


def test_unexpected_tensor(ck):
    name = "model.layers.1.self_attn.rotary_emb.inv_freq"
    _edit_shard(ck, SHARD1, lambda t: t.update({name: torch.randn(32)}))
    msg = _load_error(ck)
    assert msg.startswith(f"{ck / SHARD1}: unexpected tensor {name} (not part of a DeepseekV32ForCausalLM")


def test_wrong_shape(ck):
    name = "model.layers.0.self_attn.kv_a_layernorm.weight"
    file = _shard_of(ck, name)
    _edit_shard(ck, file, lambda t: t.update({name: torch.randn(448).bfloat16()}))
    assert _load_error(ck) == f"{ck / file}: tensor {name} has shape [448] but config.json implies [512]"


@pytest.mark.parametrize(
    ("name", "dtype", "expect"),
    [
        ("model.norm.weight", torch.float16, "is F16; expected BF16 or F32"),
        (KV_A, torch.bfloat16, "is BF16 but config.json's quantization_config says FP8 e4m3"),
        (f"{KV_A}_scale_inv", torch.bfloat16, "is BF16; expected F32"),
        ("model.embed_tokens.weight", torch.float8_e5m2, "is F8_E5M2; expected BF16 or F32"),
    ],
)
def test_dtype_surprise(ck, name, dtype, expect):
    file = _shard_of(ck, name)
    _edit_shard(ck, file, lambda t: t.update({name: t[name].float().to(dtype)}))
    msg = _load_error(ck)
    assert msg.startswith(f"{ck / file}: tensor {name} {expect}"), msg


def test_fp8_weights_with_unquantized_config(ck):
    raw = json.loads((ck / "config.json").read_text())
    del raw["quantization_config"]
    (ck / "config.json").write_text(json.dumps(raw))
    msg = _load_error(ck)
    assert "is F8_E4M3 but config.json has no quantization_config" in msg and "more problems" in msg


def test_bad_json(ck):
    (ck / INDEX).write_text('{"metadata": {}, "weight_map": {"a": ')
    assert _load_error(ck).startswith(f"{ck / INDEX}: invalid JSON at line 1 column")
    (ck / INDEX).write_text('{"metadata": {}}')
    assert _load_error(ck) == f"{ck / INDEX}: no 'weight_map' object of tensor name -> file name"
    (ck / "config.json").write_text("{\n  \"vocab_size\": 1024,\n  oops\n}")
    assert _load_error(ck).startswith(f"{ck / 'config.json'}: invalid JSON at line 3 column 3")


def test_bad_config_names_file_and_field(ck):
    raw = json.loads((ck / "config.json").read_text())
    raw["topk_group"] = 3
    (ck / "config.json").write_text(json.dumps(raw))
    assert _load_error(ck) == f"{ck / 'config.json'}: topk_group: 3 exceeds n_group 2"
    (ck / "config.json").unlink()
    assert _load_error(ck) == f"{ck / 'config.json'}: missing"


def test_missing_shard_file(ck):
    (ck / SHARD1).unlink()
    assert _load_error(ck).startswith(f"{ck / SHARD1}: missing (listed in {INDEX} for tensor ")


def test_not_a_checkpoint(tmp_path, tiny_v32_dir):
    assert _load_error(tmp_path / "nope").endswith("no such checkpoint folder or file")
    assert _load_error(tmp_path) == f"{tmp_path / 'config.json'}: missing"
    shutil.copy(tiny_v32_dir / "config.json", tmp_path)
    assert _load_error(tmp_path).endswith(f"no .safetensors files and no {INDEX}")
    (tmp_path / "weights.bin").write_bytes(b"x")
    assert "expected a checkpoint folder or a .safetensors file" in _load_error(tmp_path / "weights.bin")


def test_checkpoint_without_mtp_layer_loads_with_a_warning(ck, caplog):
    for file in (SHARD1, "model-00002-of-00002.safetensors"):
        _edit_shard(ck, file, lambda t: [t.pop(n) for n in list(t) if n.startswith("model.layers.3.")])
    with caplog.at_level(logging.WARNING):
        ckpt = load_checkpoint(ck, progress=False)
    assert ckpt.mtp_tensors == {} and "no MTP layer" in caplog.text
    assert len(ckpt.tensors) == len(load_checkpoint(ck, progress=False).tensors)


def test_partial_mtp_layer_is_an_error(ck):
    name = "model.layers.3.enorm.weight"
    _edit_shard(ck, _shard_of(ck, name), lambda t: t.pop(name))
    assert _load_error(ck) == f"{ck}: tensor {name} is missing (not in {INDEX})"


def test_format_bytes():
    assert [format_bytes(n) for n in (5, 1536, 8129000, 3 * 1024**4)] == ["5 B", "1.5 KiB", "7.8 MiB", "3.0 TiB"]
