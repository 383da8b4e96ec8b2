"""Triton kernels of the ``triton`` backend on Hopper, one module per concept.

Nothing here imports triton at package import: the plugin registers ``"module:Class"`` strings and the
kernels load on first use (the ``*_CLAIMS`` constants live in modules that import neither torch nor triton).

* indexer: :mod:`.indexer_quant` (Hadamard rotation + FP8 quantization of q and k), :mod:`.indexer_logits`
  (ragged prefill and paged decode logits), :mod:`.indexer` (the family object).
* top-k: :mod:`.topk_cand` (the default: two row passes, then radix passes over a candidate buffer),
  :mod:`.topk_radix` (full search, one program per row), :mod:`.topk_split` (a long row over several programs),
  :mod:`.topk_slots` (page-table transform), :mod:`.topk` (the family object).
* sparse attention: :mod:`.sparse_mla_prefill` (the kernel), :mod:`.sparse_mla_decode_bf16`,
  :mod:`.sparse_mla_pipe` (pipelined variants), :mod:`.mla_fp8_decode` / :mod:`.mla_fp8_decode_pipe` (656-byte
  cache), :mod:`.sparse_mla_decode_fewhead` (decode at up to 32 heads, both caches) with its launch planning
  :mod:`.fewhead_plan`, :mod:`.online_softmax` (the shared softmax step), :mod:`.sparse_mla_combine` (split-K
  merge), :mod:`.sparse_attn`.
* KV cache: :mod:`.kv_quant_kernels`, :mod:`.kv_quant`.
* MoE: :mod:`.moe_route` (grouped routing), :mod:`.moe_align` / :mod:`.moe_align_small` (sort pairs per
  expert), :mod:`.moe_quant` (FP8 activation quantization), :mod:`.moe_gemm` (grouped GEMMs),
  :mod:`.moe_experts` (the family object).
"""
