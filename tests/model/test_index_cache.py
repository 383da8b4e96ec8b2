"""IndexCache (``index_topk_freq`` / ``index_topk_pattern`` / ``index_skip_topk_offset``, set with
``--json-model-override-args``): the config rule picks exactly SGLang's Full / Shared layers, a Shared layer runs
no indexer queries and attends with the last Full layer's indices, off by default (greedy output unchanged),
and overrides that would change the checkpoint's tensors are refused."""

from __future__ import annotations

import random

import pytest

from dsa_runtime.engine import Engine, EngineConfig, SamplingParams
from dsa_runtime.errors import ConfigError
from dsa_runtime.loader.presets import preset_config
from dsa_runtime.model.config_parse import parse_hf_config
from tests.engine.helpers import run_all


def _letters(raw: dict) -> str:
    return "".join("S" if s else "F" for s in parse_hf_config(raw).index_reuse)


def test_the_rule_picks_sglangs_layers():
    raw = preset_config("tiny-v32") | {"num_hidden_layers": 12, "num_nextn_predict_layers": 0}
    assert _letters(raw) == "F" * 12  # off by default
    assert _letters(raw | {"index_topk_freq": 1}) == "F" * 12
    assert _letters(raw | {"index_topk_freq": 4}) == "FFSSSFSSSFSS"  # offset 2: layers 0, 1, 5, 9 Full
    assert _letters(raw | {"index_topk_freq": 4, "index_skip_topk_offset": 3}) == "FFFSSSFSSSFS"  # GLM-5: 0,1,2,6,10
    assert _letters(raw | {"index_topk_freq": 2, "index_skip_topk_offset": 1}) == "FSFSFSFSFSFS"
    pattern = "FSSFFSFSSSSF"
    assert _letters(raw | {"index_topk_pattern": pattern, "index_topk_freq": 4}) == pattern  # the pattern wins


@pytest.mark.parametrize("extra, message", [
    ({"index_topk_pattern": "FSF"}, "string of 12 letters"),
    ({"index_topk_pattern": "FSSFFSFSSSXF"}, "string of 12 letters"),
    ({"index_topk_pattern": "SSSFFSFSSSSF"}, "layer 0 must be F"),
    ({"index_topk_freq": 0}, "index_topk_freq"),
    ({"index_topk_freq": 4, "index_skip_topk_offset": 0}, "index_skip_topk_offset"),
])
def test_bad_settings_are_config_errors(extra, message):
    raw = preset_config("tiny-v32") | {"num_hidden_layers": 12, "num_nextn_predict_layers": 0}
    with pytest.raises(ConfigError, match=message):
        parse_hf_config(raw | extra)


def test_a_dense_model_has_no_index_cache():
    with pytest.raises(ConfigError, match="needs a DSA model"):
        parse_hf_config(preset_config("tiny-v3") | {"index_topk_freq": 2})


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from dsa_runtime.loader.make_checkpoint import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("ic") / "tiny-v32", "tiny-v32", seed=3)


def _prompts() -> list[list[int]]:
    rng = random.Random(4)
    # past index_topk (32): the indexer selects (shorter contexts attend densely and never reach it)
    return [[rng.randrange(3, 1000) for _ in range(n)] for n in (40, 57, 90, 33)]


def _run(engine: Engine, max_tokens: int = 6) -> dict[str, list[int]]:
    for i, p in enumerate(_prompts()):
        engine.add_request(f"q{i}", p, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    return {rid: outs[-1].token_ids for rid, outs in run_all(engine).items()}


def _engine(checkpoint, override: str | None = None) -> Engine:
    return Engine(EngineConfig(model=str(checkpoint), dtype="float32", chunked_prefill_size=32,
                               json_model_override_args=override))


def test_shared_layers_run_no_indexer_queries_and_reuse_the_full_layers_indices(checkpoint):
    """Pattern FSF on 3 layers: layer 1's indexer never runs a query, and every top-k site of layer 1 gets the
    very tensor layer 0 selected, in prefill chunks and decode steps alike."""
    engine = _engine(checkpoint, '{"index_topk_pattern": "FSF"}')
    layers = engine.runner.model.layers
    assert [layer.attn.reuse_topk for layer in layers] == [False, True, False]
    calls = [0, 0, 0]
    for i, layer in enumerate(layers):
        original = layer.attn.indexer.queries

        def counted(*args, i=i, original=original, **kwargs):
            calls[i] += 1
            return original(*args, **kwargs)

        layer.attn.indexer.queries = counted
    served: list[tuple[int, object, int]] = []  # (layer, site, id of the indices)
    from dsa_runtime.model import attention

    real = attention.AttnContext.shared_topk

    def spy(self, site, compute):
        got = real(self, site, compute)
        served.append((int(self.reuse_topk), site, id(got)))
        return got

    attention.AttnContext.shared_topk = spy
    try:
        _run(engine)
    finally:
        attention.AttnContext.shared_topk = real
    assert calls[0] > 0 and calls[1] == 0 and calls[2] == calls[0]
    shared = [(site, ident) for reuse, site, ident in served if reuse]
    assert shared, "no Shared layer reached a top-k site"
    computed = {}
    for reuse, site, ident in served:
        if not reuse:
            computed.setdefault(site, []).append(ident)
    for site, ident in shared:
        assert ident in computed[site]  # the exact indices a Full layer of the same step selected


def test_off_by_default_and_all_full_leave_greedy_output_unchanged(checkpoint):
    plain = _run(_engine(checkpoint))
    assert _run(_engine(checkpoint, '{"index_topk_freq": 1}')) == plain
    assert _run(_engine(checkpoint, '{"index_topk_pattern": "FFF"}')) == plain


@pytest.mark.parametrize("override, message", [
    ("not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"hidden_size": 512}', "changes the checkpoint's tensors"),
])
def test_bad_overrides_are_clear_errors(checkpoint, override, message):
    with pytest.raises(ConfigError, match=message):
        Engine(EngineConfig(model=str(checkpoint), dtype="float32", json_model_override_args=override))
