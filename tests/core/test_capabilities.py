"""Capabilities: value sets, per-method claims, the family-level form, readable reasons, strict keys."""

from __future__ import annotations

import pytest

from dsa_runtime.capabilities import Capabilities, MethodClaim, ValueSet
from dsa_runtime.families import FAMILY_METHODS, FAMILY_PROTOCOLS, METHODS


def test_value_sets():
    k128 = ValueSet.multiples(128, 128, 16384)
    assert [k128.allows(v) for v in (128, 2048, 16384, 64, 192, 16512, 0, 128.0, True)] == [
        True, True, True, False, False, False, False, False, False]
    assert k128.describe() == "multiples of 128 in [128, 16384]"
    assert ValueSet.between(1, 2).describe() == "values in [1, 2]" and ValueSet.between(1, 2).allows(2)
    assert ValueSet.one_of(128, 64).describe() == "one of [64, 128]" and not ValueSet.one_of(64).allows(65)
    assert ValueSet.one_of().describe() == "nothing" and not ValueSet.one_of().allows(64)
    assert ValueSet.any().allows("anything") and ValueSet.any().describe() == "any"
    assert ValueSet.of(None).is_any and ValueSet.of({1, 2}) == ValueSet.one_of(1, 2) and ValueSet.of(k128) is k128
    for bad in (lambda: ValueSet.multiples(0, 1, 2), lambda: ValueSet.multiples(64, 128, 64), lambda: ValueSet.of("bf16")):
        with pytest.raises((ValueError, TypeError)):
            bad()


def test_methods_match_the_protocols():
    for family, protocol in FAMILY_PROTOCOLS.items():
        public = {n for n in vars(protocol) if not n.startswith("_") and callable(getattr(protocol, n))}
        assert public == set(FAMILY_METHODS[family]), family
    assert len(METHODS) == sum(len(m) for m in FAMILY_METHODS.values()) == 18


def test_per_method_claim_reasons():
    caps = Capabilities(
        devices=frozenset({"cuda"}),
        methods={"sparse_attn.prefill": MethodClaim(heads={64, 128}, k=ValueSet.multiples(128, 128, 16384),
                                                    kv_layouts=ValueSet.one_of("bf16"))},
        not_claimed={"indexer": "no indexer here"},
    )
    assert caps.families == frozenset({"sparse_attn"}) and caps.claimed_methods() == ["sparse_attn.prefill"]
    ok = {"device": "cuda", "kv_layout": "bf16", "heads": 64, "k": 2048}
    assert caps.unclaimed_reason("sparse_attn.prefill", **ok) is None
    reason = caps.unclaimed_reason
    assert reason("sparse_attn.prefill", **{**ok, "k": 64}) == "k 64 not claimed: claims multiples of 128 in [128, 16384]"
    assert reason("sparse_attn.prefill", **{**ok, "heads": 20}) == "head count 20 not claimed: claims one of [64, 128]"
    assert reason("sparse_attn.prefill", **{**ok, "device": "cpu"}) == "device 'cpu' not claimed: claims one of ['cuda']"
    assert reason("sparse_attn.decode", **ok) == (
        "method sparse_attn.decode not provided (claims sparse_attn.prefill of sparse_attn)")
    assert reason("indexer.logits_ragged") == "no indexer here"
    assert reason("moe.route") == "family 'moe' not provided"
    assert reason("sparse_attn", **ok) is not None  # a bare family asks for all of its methods
    with pytest.raises(KeyError, match="unknown capability key 'head'"):
        reason("sparse_attn.prefill", head=64)
    with pytest.raises(KeyError, match="unknown kernel method 'sparse_attn.forward'"):
        reason("sparse_attn.forward")
    assert caps.describe() == {
        "sparse_attn.prefill": "kv_layouts one of ['bf16']; heads one of [64, 128]; k multiples of 128 in [128, 16384]"}


def test_family_level_form_expands_to_every_method():
    caps = Capabilities(families=frozenset({"topk", "sparse_attn"}), head_counts=frozenset({64}),
                        topk_values=frozenset(), max_decode_queries=1,
                        methods={"topk.topk": MethodClaim(k=ValueSet.any())})
    assert caps.claimed_methods() == ["topk.topk", "topk.page_table_transform", "topk.topk_transform",
                                      "sparse_attn.prefill", "sparse_attn.decode"]
    assert caps.unclaimed_reason("topk.topk", k=5) is None  # the explicit method claim wins
    assert caps.unclaimed_reason("topk.topk_transform", k=5) == "k 5 not claimed: claims nothing"
    assert caps.unclaimed_reason("sparse_attn.decode", decode_queries=2) == (
        "decode queries per request 2 not claimed: claims values in [1, 1]")
    assert caps.unclaimed_reason("sparse_attn.decode", kv_layout="fp8_656", device="cpu") is None


def test_bad_declarations_are_errors():
    with pytest.raises(ValueError, match="unknown kernel families"):
        Capabilities(families=frozenset({"attention"}))
    with pytest.raises(ValueError, match="unknown kernel methods"):
        Capabilities(methods={"topk.fast": MethodClaim()})
    with pytest.raises(ValueError, match="neither families nor family.method"):
        Capabilities(not_claimed={"topk.fast": "x"})
    with pytest.raises(TypeError, match="must be a MethodClaim"):
        Capabilities(methods={"topk.topk": {"k": {2048}}})  # type: ignore[dict-item]


def test_readme_backend_example_declares_a_per_method_claim():
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Writing a backend plugin", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    namespace: dict = {}
    exec(compile("\n".join(line[3:] for line in code.splitlines()), "README.md", "exec"), namespace)
    registered = []
    namespace["dsa_register_backends"](registered.append)
    caps = registered[0].capabilities
    assert caps.claimed_methods() == ["sparse_attn.prefill"]
    assert caps.unclaimed_reason("sparse_attn.prefill", device="cuda", heads=64, k=64) == (
        "k 64 not claimed: claims multiples of 128 in [128, 16384]")
    assert caps.unclaimed_reason("sparse_attn.decode") == "decode ships in my_flashmla_kv"
