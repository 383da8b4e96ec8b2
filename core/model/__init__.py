"""The DeepSeek V3 / V3.2 model: config, layers and the model runner the engine drives.

Layout (one concept per file): ``config.py`` / ``config_parse.py`` (ModelConfig), ``step.py`` (Step, the one
description of a step: token rows; the Runner protocol), ``slots.py`` (per-slot state: the host's SlotTable, each
rank's SlotState), ``batch.py`` (the flat per-step metadata derived from the rows), ``runner.py`` (ModelRunner,
kernel_needs), ``decode_graph.py`` (CUDA graphs per bucket), ``seqs.py`` (per-sequence batches for tests and
benchmarks), ``deepseek.py``
(decoder stack), ``mla.py`` (projections, cache writes), ``attention.py`` (absorbed sparse / dense and MHA
paths), ``indexer.py`` (lightning indexer), ``moe.py`` (dense FFN and MoE), ``rope.py`` (YaRN), ``ops.py``
(norms, ``linear``), ``weights.py`` (what stays FP8). Kernels are reached only through the resolved kernels.

Design choices where the spec leaves room:

* Every attention path reads keys back from the paged cache after the step's rows are written, so prefill,
  chunked prefill and decode use the same stored values (the fp8_656 cache's ue8m0 scales make its bf16
  dequantisation exact).
* Dense prefill (DSA: at most ``index_topk`` keys; V3: at most ``mha_max_keys``, default 2048) runs MHA
  with per-head ``k_nope``/``v`` from the cached latents (one ``kv_b_proj`` GEMM in the model dtype,
  scores and softmax in fp32), chunks of equal start and length batched; on CPU a sparse DSA chunk of at
  most ``mha_max_keys`` keys runs the same MHA over the indexer's top-k selection (a third of the absorbed
  form's score FLOPs at few heads); everything else runs the absorbed 576-d form through
  ``kernels.sparse_attn``. The dense V3 family uses the sparse kernels with every
  visible slot as its index set (padded to a multiple of 64) -- one code path for both families.
* Prefill top-k uses ``kernels.topk.topk`` (positions index the gathered per-sequence buffer directly);
  decode uses ``kernels.topk.topk_transform`` to physical slots over the paged cache.
* Routed / shared experts stay FP8 for ``kernels.moe.experts``; other linears are dequantised to the model
  dtype at load. The MTP layer's tensors are kept aside (``ModelRunner.mtp_tensors``), not run.
"""
