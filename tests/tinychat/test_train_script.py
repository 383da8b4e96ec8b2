"""train/train_tiny.py end to end on the CPU (a few steps): stages, loss log, resume state, loadable checkpoint;
a fine-tune of the release with JSON answers, then train_nextn.py from the release's MTP layer."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "train" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_three_stages_write_a_log_a_resumable_state_and_an_fp8_checkpoint(tmp_path, capsys):
    train = _load("train_tiny")
    out = tmp_path / "run"
    assert train.main(["--out", str(out), "--device", "cpu", "--ctx", "128", "--batch", "2",
                       "--conversations", "60", "--steps", "6", "--workers", "1"]) == 0
    table = capsys.readouterr().out.strip().splitlines()[-4:]
    assert table[0].split() == ["stage", "steps", "ce", "kl", "acc", "sec"]
    assert [row.split()[0] for row in table[1:]] == ["dense", "warmup", "sparse"]
    log = [json.loads(line) for line in (out / "loss.jsonl").read_text().splitlines()]
    assert {r["stage"] for r in log} == {"dense", "warmup", "sparse"}
    assert all(r["kl"] == 0 for r in log if r["stage"] == "dense")
    assert all(r["kl"] > 0 for r in log if r["stage"] != "dense")
    assert len(list(out.glob("state-*.safetensors"))) == 4

    from dsa_runtime import LLM, SamplingParams

    llm = LLM(model=str(out / "checkpoint"))
    (res,) = llm.generate("Hello", SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert len(res.token_ids) == 3

    export = _load("export_tiny")
    assert export.main([str(out), str(tmp_path / "exported")]) == 0
    a = json.loads((tmp_path / "exported" / "model.safetensors.index.json").read_text())
    b = json.loads((out / "checkpoint" / "model.safetensors.index.json").read_text())
    assert a["weight_map"] == b["weight_map"]


def test_fine_tune_of_the_release_with_json_answers_then_its_nextn_layer(tmp_path, capsys):
    """``--init-checkpoint`` takes the release's main model and tokenizer (its MTP layer is train_nextn's to
    redo); ``train_nextn.py --init-mtp`` starts the MTP layer from the release's. At lr 0 both come back as
    they went in, and the release's MTP layer drafts the release's main model well."""
    from safetensors.torch import load_file

    from dsa_runtime.loader import embedded_model_path

    release = embedded_model_path()
    train = _load("train_tiny")
    out = tmp_path / "ft"
    assert train.main(["--out", str(out), "--init-checkpoint", str(release), "--stages", "sparse", "--lr", "0",
                       "--dense-every", "2", "--json-share", "0.5", "--device", "cpu", "--ctx", "512",
                       "--batch", "2", "--conversations", "60", "--steps", "2", "--workers", "1", "--threads", "1"]) == 0
    index = json.loads((out / "checkpoint" / "model.safetensors.index.json").read_text())
    assert "model.layers.4.self_attn.kv_a_proj_with_mqa.weight" in index["weight_map"]
    assert not any(k.startswith("model.layers.5.") for k in index["weight_map"])
    assert json.loads((out / "checkpoint" / "config.json").read_text())["num_nextn_predict_layers"] == 0
    assert (out / "tokenizer.json").read_text() == (release / "tokenizer.json").read_text()

    nextn = _load("train_nextn")
    mtp = tmp_path / "mtp"
    capsys.readouterr()
    assert nextn.main(["--out", str(mtp), "--checkpoint", str(out / "checkpoint"), "--init-mtp", str(release),
                       "--lr", "0", "--device", "cpu", "--ctx", "512", "--batch", "2", "--conversations", "120",
                       "--steps", "2", "--workers", "1", "--threads", "1"]) == 0
    # held-out top-1 of the first draft on the mixture's chats (a fresh layer scores near 0; JSON answers would
    # not do here: the release's main model has not learnt them, nor can any model guess their made-up values)
    acc1 = float(capsys.readouterr().out.strip().splitlines()[-1].split()[3])
    assert acc1 > 0.9
    assert json.loads((mtp / "checkpoint" / "config.json").read_text())["num_nextn_predict_layers"] == 1
    got = train.load_checkpoint_state(str(mtp / "checkpoint"))
    want = train.load_checkpoint_state(str(release))
    layer5 = sorted(k for k in want if k.startswith("model.layers.5."))
    assert len(layer5) > 20 and set(layer5) == {k for k in got if k.startswith("model.layers.5.")}
    for k in layer5:  # re-quantised: the same values (a block may pick another power-of-two scale)
        if k.endswith("e_score_correction_bias"):  # balanced by expert load, not by the learning rate
            assert (got[k] - want[k]).abs().max() <= 2.5e-3, k
        else:
            assert torch.equal(got[k], want[k]), k
    # the main model's tensors are the fine-tune's, byte for byte
    main = {k: v for f in (out / "checkpoint").glob("*.safetensors") for k, v in load_file(str(f)).items()}
    final = {k: v for f in (mtp / "checkpoint").glob("*.safetensors") for k, v in load_file(str(f)).items()}
    assert all(torch.equal(final[k].view(torch.uint8), v.view(torch.uint8)) for k, v in main.items() if v.dim())
