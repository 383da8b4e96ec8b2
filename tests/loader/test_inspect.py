"""``dsa-runtime inspect`` and the summary behind it: parameters, bytes, KV per token, meta build."""

from __future__ import annotations

import json
import resource

from dsa_runtime.cli.main import main
from dsa_runtime.loader.presets import preset_config
from dsa_runtime.loader.summary import kv_bytes, summarize_config
from dsa_runtime.model.config import ModelConfig
from tests.loader.real_configs import v3_671b, v32_671b


def test_kv_bytes_per_token():
    v32 = kv_bytes(ModelConfig.from_hf(v32_671b()))
    assert (v32.mla_bf16, v32.mla_fp8, v32.index_k, v32.layers) == (1152, 656, 132, 62)
    assert v32.per_token("bf16") == 62 * (1152 + 132) == 79608
    assert v32.per_token("fp8_656") == 62 * (656 + 132) == 48856
    v3 = kv_bytes(ModelConfig.from_hf(v3_671b()))
    assert v3.index_k == 0 and v3.per_token("fp8_656") == 62 * 656
    tiny = kv_bytes(ModelConfig.from_hf(preset_config("tiny-v32")))
    assert (tiny.layers, tiny.per_token("bf16")) == (4, 4 * (1152 + 132))


def test_v3_weight_bytes_equal_the_published_checkpoint():
    s = summarize_config(ModelConfig.from_hf(v3_671b()), build=False)
    # DeepSeek-V3's safetensors hold 688,574,839,360 bytes in 91,991 tensors
    assert s.weight_bytes_main + s.weight_bytes_mtp == 688_574_839_360
    assert s.num_tensors == 91991
    assert (s.dense_layers, s.moe_layers, s.mtp_layers) == (3, 58, 1)


def test_inspect_real_v32_config_builds_on_meta_without_memory(tmp_path, capsys):
    cfg_file = tmp_path / "config.json"
    cfg_file.write_text(json.dumps(v32_671b()))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert main(["inspect", str(cfg_file), "--json"]) == 0
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    out = json.loads(capsys.readouterr().out)
    assert grown_kib < 2 * 1024 * 1024  # 642 GiB of weights were never allocated
    assert out["architecture"] == "DeepseekV32ForCausalLM" and out["num_tensors"] == 92425
    assert out["params_main"] + out["params_mtp"] == 685_355_329_792
    assert out["kv"]["per_token_fp8_656"] == 48856 and out["kv"]["per_token_bf16"] == 79608
    assert "meta device" in out["meta_build"]
    assert out["index_topk"] == 2048 and out["scale_fmt"] == "ue8m0"


def test_inspect_checkpoint_text(tiny_v32_dir, capsys):
    assert main(["inspect", str(tiny_v32_dir)]) == 0
    text = capsys.readouterr().out
    assert "DeepseekV32ForCausalLM: DSA (lightning indexer, index_topk 32 of 4,096 positions)" in text
    assert "1 dense + 2 MoE + 1 MTP" in text
    assert "parameters       6,930,968" in text
    assert "bf16 layout 5,136 B/token, FP8 layout 3,152 B/token" in text
    assert "tokenizer        1,024 tokens" in text
    assert "meta build" not in text  # a checkpoint is sized from its headers, not built


def test_inspect_folder_with_config_only_and_preset(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(preset_config("tiny-v3")))
    assert main(["inspect", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "DeepseekV3ForCausalLM: dense MLA" in text and "meta build" in text
    assert main(["inspect", "tiny-v32", "--no-build"]) == 0
    assert "source           preset tiny-v32" in capsys.readouterr().out


def test_inspect_errors_are_one_line(tmp_path, tiny_v32_dir, capsys):
    raw = v32_671b()
    raw["index_topk"] = 0
    (tmp_path / "bad.json").write_text(json.dumps(raw))
    assert main(["inspect", str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"dsa-runtime: error: {tmp_path / 'bad.json'}: index_topk: must be >= 1, got 0"
    assert main(["inspect", str(tmp_path / "missing")]) == 2
    assert "no such checkpoint folder or config.json" in capsys.readouterr().err
    ck = tmp_path / "ck"
    ck.mkdir()
    for f in tiny_v32_dir.iterdir():
        (ck / f.name).write_bytes(f.read_bytes())
    shard = ck / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    assert main(["inspect", str(ck)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{shard}: truncated: tensor" in err and "\n" not in err
