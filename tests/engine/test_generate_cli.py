"""``dsa-runtime generate`` wiring, on the toy runner (the real-model run is in test_real_model.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dsa_runtime.cli import generate_cmd
from dsa_runtime.cli.main import main
from dsa_runtime.engine import Engine
from tests.engine.fakes import BYTE0, EOS, FakeTokenizer, hash_logits, make_parts

TOK = FakeTokenizer()


def _fake_engine(monkeypatch, reply: str | None = None) -> dict:
    """Replace model loading by the toy runner; ``reply`` scripts greedy output after any prompt."""
    seen: dict = {}
    script = [BYTE0 + b for b in (reply or "").encode()] + [EOS]

    def logits(tokens):
        out = hash_logits(tokens, TOK.vocab_size)
        if reply is not None:
            out[script[min(len(tokens) - seen["prompt_len"], len(script) - 1)]] = 80.0
        return out

    def build(config):
        seen["config"] = config
        parts = make_parts(logit_fn=logits, num_pages=1025)
        parts.model_config = SimpleNamespace(is_dsa=True, scale_fmt="ue8m0")
        engine = Engine(config, parts=parts)
        add = engine.add_request

        def add_request(rid, ids, params):
            seen["prompt_len"], seen["params"] = len(ids), params
            add(rid, ids, params)

        engine.add_request = add_request
        return engine

    monkeypatch.setattr(generate_cmd, "_engine", build)
    return seen


def test_prompt_streams_text_and_passes_options(monkeypatch, capsys):
    seen = _fake_engine(monkeypatch, reply="Hi there")
    code = main(["generate", "--prompt", "Hello", "--max-tokens", "30", "--temperature", "0", "--seed", "5",
                 "--max-model-len", "500", "--nsa-decode-backend", "reference", "--kv-cache-dtype", "bf16"])  # fmt: skip
    out = capsys.readouterr()
    assert code == 0 and out.out == "Hi there\n"
    assert "[9 tokens, finish: stop" in out.err
    cfg = seen["config"]
    assert (cfg.seed, cfg.max_model_len, cfg.dsa_decode_backend, cfg.kv_cache_dtype) == (
        5,
        500,
        "reference",
        "bf16",
    )
    assert (seen["params"].seed, seen["params"].max_tokens, seen["params"].temperature) == (5, 30, 0.0)
    assert seen["prompt_len"] == 1 + len(TOK.encode("Hello"))  # BOS + text


def test_chat_thinking_shows_reasoning_then_content(monkeypatch, capsys):
    _fake_engine(monkeypatch, reply="let me think</think>Bonjour")
    assert main(["generate", "--chat", "Salut", "--thinking", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert out == "[thinking] let me think\n[answer] Bonjour\n"  # not a TTY: no dimming codes, markers removed


def test_bad_values_are_one_line_errors(monkeypatch, capsys):
    _fake_engine(monkeypatch)
    assert main(["generate", "--prompt", "x", "--temperature", "-1"]) == 2
    assert "temperature must be" in capsys.readouterr().err
    assert main(["generate", "--prompt", "x", "--chunked-prefill-size", "0"]) == 2
    assert "--chunked-prefill-size must be" in capsys.readouterr().err


def test_prompt_or_chat_is_required(capsys):
    with pytest.raises(SystemExit):
        main(["generate"])
    with pytest.raises(SystemExit):
        main(["generate", "--prompt", "a", "--chat", "b"])
    assert "not allowed with" in capsys.readouterr().err
