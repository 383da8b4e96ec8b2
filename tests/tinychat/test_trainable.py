"""The training forward against the runtime, sparse masking, the indexer loss, and the embedded model."""

from __future__ import annotations

import json

import pytest
import torch

from dsa_runtime.loader.presets import preset_config
from dsa_runtime.model.config_parse import parse_hf_config
from dsa_runtime.model.trainable import TrainableDeepseek


def _small_raw() -> dict:
    raw = preset_config("tiny-chat")
    raw.update(num_hidden_layers=2, index_topk=16, vocab_size=3072)
    return raw


@pytest.fixture(scope="module")
def model():
    from dsa_runtime.loader.random_init import random_state_dict

    raw = _small_raw()
    cfg = parse_hf_config(raw)
    state = random_state_dict(cfg, seed=4, fp8=False)
    return raw, state, TrainableDeepseek(cfg, state)


def test_training_forward_matches_the_runtime_logits(model, tmp_path):
    from dsa_runtime import LLM
    from dsa_runtime.loader import embedded_model_path
    from dsa_runtime.loader.export import write_checkpoint

    raw, state, m = model
    tok = (embedded_model_path() / "tokenizer.json").read_text(encoding="utf-8")
    ck = write_checkpoint(tmp_path / "ck", raw, state, tok, fp8=False)
    llm = LLM(model=str(ck), dtype="float32")
    gen = torch.Generator().manual_seed(1)
    for t in (12, 16):  # dense attention (<= index_topk): the exact same math
        ids = torch.randint(3, 3000, (t,), generator=gen)
        ref = torch.as_tensor(llm.score(ids.tolist()))
        with torch.no_grad():
            out = m(ids[None], torch.arange(t)[None], torch.zeros(1, t, dtype=torch.long), sparse=True).logits[0]
        close = ((out - ref).abs().amax(-1) < 0.05).float().mean().item()
        # bf16 cache rows vs fp32 may flip a near-tied expert choice at a rare position; the rest must agree.
        assert close >= 0.9, (t, close)


def test_indexer_scores_match_the_reference_fp8_kernels(model):
    """The training indexer is the kernels' indexer without the FP8 rounding (Hadamard is orthogonal)."""
    from dsa_runtime.model.ops import rms_norm
    from dsa_runtime.reference.indexer import ReferenceIndexer

    _raw, _state, m = model
    cfg = m.cfg
    t = 40
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(1, t, cfg.hidden_size, generator=gen)
    pre = "model.layers.1.self_attn"
    with torch.no_grad():
        qr = rms_norm(x[0] @ m.w(f"{pre}.q_a_proj.weight").T, m.w(f"{pre}.q_a_layernorm.weight"), cfg.rms_norm_eps)
        turn = m.rope.turns(torch.arange(t))
        ours = m._index_logits(x, qr[None], turn, pre)[0]
        # The same q / k / head weights, through the reference kernels' FP8 path.
        from dsa_runtime.model.ops import layer_norm
        from dsa_runtime.model.rope import apply_neox

        def rot(z):
            return torch.cat([apply_neox(z[..., :64], turn), z[..., 64:]], dim=-1)

        ip = f"{pre}.indexer"
        q = rot((qr @ m.w(f"{ip}.wq_b.weight").T).view(t, cfg.index_n_heads, 128))
        k = rot(layer_norm(x[0] @ m.w(f"{ip}.wk.weight").T, m.w(f"{ip}.k_norm.weight"), m.w(f"{ip}.k_norm.bias"),
                           cfg.rms_norm_eps))
        kern = ReferenceIndexer()
        q8, w = kern.quantize_q(q, x[0] @ m.w(f"{ip}.weights_proj.weight").T, scale_fmt="ue8m0")
        k8, ks = kern.quantize_k(k, scale_fmt="ue8m0")
        ends = torch.arange(1, t + 1, dtype=torch.int32)
        ref = kern.logits_ragged(q8, w, k8, ks, torch.zeros_like(ends), ends)
    causal = torch.isfinite(ref)
    err = (ours[causal] - ref[causal]).abs() / ref[causal].abs().mean()
    assert err.median() < 0.05 and err.max() < 0.3  # FP8 e4m3 rounding of q and k only


def test_sparse_equals_dense_within_index_topk_and_differs_beyond(model):
    _raw, _state, m = model
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 3000, (2, 48), generator=gen)
    pos = torch.arange(48).repeat(2, 1)
    doc = torch.zeros(2, 48, dtype=torch.long)
    with torch.no_grad():
        dense = m(ids, pos, doc).logits
        sparse = m(ids, pos, doc, sparse=True, index_loss=True)
    torch.testing.assert_close(sparse.logits[:, :16], dense[:, :16])
    assert (sparse.logits[:, 17:] - dense[:, 17:]).abs().max() > 1e-3
    assert torch.isfinite(sparse.index_kl) and sparse.index_kl >= 0


def test_packed_documents_do_not_see_each_other(model):
    _raw, _state, m = model
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randint(3, 3000, (10,), generator=gen), torch.randint(3, 3000, (8,), generator=gen)
    packed = torch.cat([a, b])[None]
    pos = torch.cat([torch.arange(10), torch.arange(8)])[None]
    doc = torch.tensor([[0] * 10 + [1] * 8])
    with torch.no_grad():
        both = m(packed, pos, doc).logits[0]
        alone = m(b[None], torch.arange(8)[None], torch.zeros(1, 8, dtype=torch.long)).logits[0]
    torch.testing.assert_close(both[10:], alone, atol=1e-4, rtol=1e-4)


def test_indexer_warmup_gradients_reach_only_the_indexer(model):
    _raw, state, _m = model
    m = TrainableDeepseek(parse_hf_config(_small_raw()), state)
    ids = torch.randint(3, 3000, (1, 40), generator=torch.Generator().manual_seed(5))
    out = m(ids, torch.arange(40)[None], torch.zeros(1, 40, dtype=torch.long), index_loss=True)
    out.index_kl.backward()
    idx = {id(p) for p in m.indexer_parameters()}
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in m.indexer_parameters())
    assert all(p.grad is None for p in m.parameters() if id(p) not in idx)


def test_embedded_checkpoint_is_the_fp8_tiny_chat_model_under_20_mb():
    from dsa_runtime.loader import default_model_path, load_checkpoint

    path = default_model_path()
    size = sum(f.stat().st_size for f in path.iterdir())
    assert size < 20 * 2**20
    raw = json.loads((path / "config.json").read_text())
    assert raw == preset_config("tiny-chat")
    ck = load_checkpoint(path)
    assert ck.config.is_dsa and ck.config.quantization is not None
    assert any(t.dtype == torch.float8_e4m3fn for t in ck.tensors.values())


def test_make_checkpoint_writes_a_random_tiny_chat_model_with_the_embedded_tokenizer(tmp_path):
    from dsa_runtime.loader import default_model_path, load_checkpoint
    from dsa_runtime.loader.make_checkpoint import make_checkpoint

    path = make_checkpoint(tmp_path / "rnd", "tiny-chat", seed=1)
    assert (path / "tokenizer.json").read_text() == (default_model_path() / "tokenizer.json").read_text()
    assert load_checkpoint(path).config.vocab_size == 3072
