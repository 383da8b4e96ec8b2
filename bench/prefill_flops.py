"""FLOPs of a DSA prefill chunk and its compute roofline (``bench/prefill_real_gpu.py``).

A chunk is ``n`` prompt tokens at positions ``start .. start + n - 1`` of one request, every earlier position
already cached. Matmul FLOPs (2 per multiply-add) per family, as the runtime computes them:

* ``dense`` (bf16: the runner dequantises every non-expert linear at load): per token and layer the MLA
  projections (``q_a``, ``q_b``, ``kv_a``, ``o``), the absorbed per-head ``W_UK`` / ``W_UV`` products, the
  indexer's ``wq_b``, ``wk`` and head-weight projections, the dense FFN (layers ``< first_k_dense_replace``)
  or the MoE router; plus, for a prompt's last chunk, ``lm_head`` over its last row (the logits a prefill
  returns; earlier chunks pick no row, as the engine runs them).
* ``attention`` (bf16): absorbed sparse MLA, per query row and head ``(576 + 512)`` MACs per key over its
  ``min(position + 1, index_topk)`` selected keys (every visible key without an indexer).
* ``indexer`` (FP8): logits ``index_n_heads x index_head_dim`` MACs per query row and visible key
  (``position + 1`` keys), in layers that select their own top-k (IndexCache Shared layers reuse them).
* ``moe`` (FP8 block-scaled experts): per token and MoE layer ``num_experts_per_tok + n_shared_experts``
  SwiGLU experts of three ``hidden x moe_intermediate_size`` GEMMs.

Top-k, quantisation, norms and the KV-cache traffic add no matmul FLOPs: the roofline is the compute bound
``(dense + attention) / bf16 rate + (indexer + moe) / FP8 rate``.
"""

from __future__ import annotations

BF16_FAMILIES = ("dense", "attention")
FP8_FAMILIES = ("indexer", "moe")


def visible_keys(start: int, n: int, cap: int | None = None) -> int:
    """``sum(min(p + 1, cap) for p in range(start, start + n))`` in closed form (``cap`` None: no cap)."""
    lo, hi = start + 1, start + n  # the rows' key counts before the cap
    if n <= 0:
        return 0
    if cap is None or hi <= cap:
        return (lo + hi) * n // 2
    if lo > cap:
        return cap * n
    return (lo + cap) * (cap - lo + 1) // 2 + cap * (hi - cap)


def chunk_flops(config, start: int, n: int, *, last: bool) -> dict[str, int]:
    """Matmul FLOPs of one prefill chunk over every layer of ``config`` (a DSA ``ModelConfig`` with q-LoRA),
    by family (``dense``, ``attention``, ``indexer``, ``moe``; module docstring); ``last``: the prompt's last
    chunk (its last row's logits are computed)."""
    if not config.is_dsa or config.q_lora_rank is None:
        raise ValueError("chunk_flops models DeepSeek sparse attention (an indexer and q-LoRA)")
    d, heads, lora = config.hidden_size, config.num_attention_heads, config.kv_lora_rank
    nope, rope, v, q_lora = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim, config.q_lora_rank
    ih, idim = config.index_n_heads, config.index_head_dim
    attn_proj = (d * q_lora + q_lora * heads * (nope + rope) + d * (lora + rope)  # q_a, q_b, kv_a
                 + heads * nope * lora + heads * lora * v + heads * v * d)  # W_UK, W_UV, o_proj
    index_proj = q_lora * ih * idim + d * idim + d * ih  # wq_b, wk, weights_proj
    expert = 3 * d * config.moe_intermediate_size
    attn_keys = visible_keys(start, n, config.index_topk)
    out = {"dense": 2 * d * config.vocab_size if last else 0, "attention": 0, "indexer": 0, "moe": 0}
    for layer in range(config.num_hidden_layers):
        moe = config.is_moe_layer(layer)
        ffn = d * config.n_routed_experts if moe else 3 * d * config.intermediate_size
        out["dense"] += 2 * n * (attn_proj + index_proj + ffn)
        out["attention"] += 2 * heads * (lora + rope + lora) * attn_keys
        if not config.reuses_topk(layer):
            out["indexer"] += 2 * ih * idim * visible_keys(start, n)
        if moe:
            out["moe"] += 2 * n * expert * (config.num_experts_per_tok + config.n_shared_experts)
    return out


def prompt_flops(config, prompt: int, chunk: int) -> dict[str, int]:
    """:func:`chunk_flops` summed over a prompt of ``prompt`` tokens prefilled in chunks of ``chunk``."""
    total = dict.fromkeys(("dense", "attention", "indexer", "moe"), 0)
    for start in range(0, prompt, chunk):
        for family, flops in chunk_flops(config, start, min(chunk, prompt - start),
                                         last=start + chunk >= prompt).items():
            total[family] += flops
    return total


def roofline_s(flops: dict[str, int], bf16_tflops: float, fp8_tflops: float) -> float:
    """Seconds the matmuls take at the measured rates: bf16 families at ``bf16_tflops``, FP8 at ``fp8_tflops``."""
    bf16 = sum(flops[f] for f in BF16_FAMILIES)
    fp8 = sum(flops[f] for f in FP8_FAMILIES)
    return bf16 / (bf16_tflops * 1e12) + fp8 / (fp8_tflops * 1e12)
