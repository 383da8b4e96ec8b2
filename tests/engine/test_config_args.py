"""EngineConfig is the single source of the CLI flags (names, aliases, defaults, validation)."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from dsa_runtime.engine import EngineConfig, add_dataclass_arguments, config_from_args
from dsa_runtime.errors import ConfigError, DSAError


def _parse(argv: list[str]) -> EngineConfig:
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, EngineConfig)
    return config_from_args(parser.parse_args(argv), EngineConfig)


def test_defaults_come_from_the_dataclass():
    assert _parse([]) == EngineConfig()


def test_every_field_has_a_flag_and_help():
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, EngineConfig)
    options = {opt for action in parser._actions for opt in action.option_strings}
    for f in fields(EngineConfig):
        assert f.metadata["flag"] in options and f.metadata["help"]
    for flag in (
        "--model", "--dtype", "--device", "--kv-cache-dtype", "--page-size", "--max-total-tokens",
        "--mem-fraction-static", "--chunked-prefill-size", "--max-running-requests", "--max-model-len", "--seed",
        "--dsa-prefill-backend", "--dsa-decode-backend", "--dsa-topk-backend",
        "--nsa-prefill-backend", "--nsa-decode-backend", "--nsa-topk-backend",
    ):  # fmt: skip
        assert flag in options, flag


def test_values_types_and_aliases():
    cfg = _parse(
        ["--model", "/m", "--kv-cache-dtype", "fp8_e4m3", "--page-size", "64", "--mem-fraction-static", "0.5",
         "--nsa-decode-backend", "reference", "--max-model-len", "77"]
    )  # fmt: skip
    assert cfg.model == "/m" and cfg.kv_layout == "fp8_656" and cfg.page_size == 64
    assert (
        cfg.mem_fraction_static == 0.5 and cfg.dsa_decode_backend == "reference" and cfg.max_model_len == 77
    )


def test_bad_choice_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit):
        _parse(["--kv-cache-dtype", "int4"])
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"dtype": "float16"}, "--dtype"),
        ({"kv_cache_dtype": "fp8"}, "--kv-cache-dtype"),
        ({"chunked_prefill_size": 0}, "--chunked-prefill-size"),
        ({"max_running_requests": -1}, "--max-running-requests"),
        ({"mem_fraction_static": 1.5}, "--mem-fraction-static"),
    ],
)
def test_bad_values_name_the_flag(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        EngineConfig(**kwargs)


def test_kernel_config_mapping():
    kc = EngineConfig(
        kv_cache_dtype="bf16", dsa_topk_backend="reference", dsa_prefill_backend="a", dsa_decode_backend="b",
        indexer_backend="c", kv_quant_backend="d", moe_backend="e", platform="cpu", device="cpu",
    ).kernel_config()  # fmt: skip
    assert (kc.kv_layout, kc.topk, kc.sparse_attn_prefill, kc.sparse_attn_decode) == (
        "bf16",
        "reference",
        "a",
        "b",
    )
    assert (kc.indexer, kc.kv_quant, kc.moe, kc.platform, kc.device) == ("c", "d", "e", "cpu", "cpu")
    assert EngineConfig(kv_cache_dtype="fp8_e4m3").kernel_config().kv_layout == "fp8_656"
    assert EngineConfig(dtype="bf16").dtype == "bfloat16"


def test_unknown_backend_is_a_one_line_config_error():
    from dsa_runtime.resolve import resolve_kernels

    with pytest.raises(DSAError, match="no-such-backend.*registered backends"):
        resolve_kernels(EngineConfig(dsa_decode_backend="no-such-backend").kernel_config())
