"""The ``torch`` backend: every kernel family in plain PyTorch, written for CPU speed.

Same contracts as the ``reference`` backend (``dsa_runtime.families``) and certified against it by the
conformance kit; it differs in how, never in what: work is vectorised over rows and requests, top-k uses
``torch.topk``, FP8 expert weights are dequantised once and cached, and bf16 is used where the contract's
tolerances allow it (MoE GEMMs, the attention ``P @ V`` product). The CPU platform prefers it.
"""
