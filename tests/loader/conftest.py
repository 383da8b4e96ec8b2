"""Tiny checkpoints shared by the loader tests (generated once per session; ~2 s each)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_v32_dir(tmp_path_factory):
    from dsa_runtime.loader.make_checkpoint import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-v32", "tiny-v32", seed=0)


@pytest.fixture(scope="session")
def tiny_v3_dir(tmp_path_factory):
    from dsa_runtime.loader.make_checkpoint import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-v3", "tiny-v3", seed=1, num_shards=3)


@pytest.fixture(scope="session")
def tokenizer(tiny_v32_dir):
    from dsa_runtime.loader.tokenizer import load_tokenizer

    return load_tokenizer(tiny_v32_dir)
