"""The installed ``deep_gemm`` module, with its API generation detected by feature (no version parsing).

Two naming generations exist (DeepGEMM ``csrc/apis/attention.hpp``):

* ``fp8``: ``fp8_mqa_logits(q, (k8, k_scale), weights, ks, ke, clean_logits)`` and
  ``fp8_paged_mqa_logits(q, kv_cache, weights, context_lens[B], block_table, schedule_meta, max_context_len,
  clean_logits)``; ``get_paged_mqa_logits_metadata(context_lens[B], block_kv, num_sms)`` (releases of 2025-09/10).
* ``fp8_fp4``: ``fp8_fp4_mqa_logits((q, None), ...)`` and ``fp8_fp4_paged_mqa_logits((q, None), ...,
  logits_dtype=...)`` with 2-D context lengths ``[B, next_n]`` (query j's own length) for both the metadata
  and the kernel (releases from 2026-04 on; the ``fp8_*`` names survive there as wrappers that also need 2-D
  lengths, so the generation is decided by the presence of the ``fp8_fp4_*`` names).

Neither generation's paged kernel writes ``-inf`` past each query's causal limit without ``clean_logits``, and
the newer one refuses ``clean_logits`` with 2-D lengths: the adapter masks paged logits itself.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from types import ModuleType

PAGED_BLOCK = 64  # SM90 paged MQA logits: block_kv == 64
TMA_ALIGN = 16  # bytes: TMA descriptors need 16-byte aligned base addresses (cuTensorMapEncodeTiled)


def tma_ready(t):  # noqa: ANN001, ANN201 (a tensor; torch is imported lazily)
    """``t`` contiguous with a 16-byte aligned base, copied only when it is not already.

    DeepGEMM builds TMA descriptors straight from ``data_ptr()``: a contiguous view at an odd offset of a larger
    buffer (a slice of a cache, of a fused weight) passes every shape check and is still refused or misread.
    """
    if t.is_contiguous() and t.data_ptr() % TMA_ALIGN == 0:
        return t
    import torch

    return t.clone(memory_format=torch.contiguous_format)  # a fresh allocation: aligned


@dataclass(frozen=True)
class DeepGEMMAPI:
    """Entry points of one installed ``deep_gemm``.

    Attributes:
        module: the imported module.
        generation: ``"fp8_fp4"`` (tuple q, ``logits_dtype``, 2-D context lengths) or ``"fp8"``.
    """

    module: ModuleType
    generation: str

    @property
    def two_d_lens(self) -> bool:
        return self.generation == "fp8_fp4"

    def mqa_logits(self, q8, k8, k_scale, weights, ks, ke):  # noqa: ANN001, ANN201 (tensors; torch is lazy)
        """Ragged logits ``[T, S]`` fp32, ``-inf`` outside ``[ks, ke)`` (DeepGEMM's clean_logits)."""
        m = self.module
        if self.generation == "fp8_fp4":
            import torch

            return m.fp8_fp4_mqa_logits(
                (q8, None), (k8, k_scale), weights, ks, ke, clean_logits=True, logits_dtype=torch.float32
            )
        return m.fp8_mqa_logits(q8, (k8, k_scale), weights, ks, ke, clean_logits=True)

    def paged_metadata(self, context_lens, num_sms: int):  # noqa: ANN001, ANN201
        """Schedule metadata ``[num_sms + 1, 2]`` int32 for ``context_lens`` (1-D or 2-D per generation)."""
        return self.module.get_paged_mqa_logits_metadata(context_lens, PAGED_BLOCK, num_sms)

    def paged_logits(self, q8, kv_cache, weights, context_lens, block_table, schedule, max_len: int):  # noqa: ANN001, ANN201
        """Paged logits ``[B * N, max_len]`` fp32; entries past each query's limit are unspecified."""
        m = self.module
        if self.generation == "fp8_fp4":
            import torch

            return m.fp8_fp4_paged_mqa_logits(
                (q8, None), kv_cache, weights, context_lens, block_table, schedule, max_len,
                clean_logits=False, logits_dtype=torch.float32,
            )
        return m.fp8_paged_mqa_logits(
            q8, kv_cache, weights, context_lens, block_table, schedule, max_len, clean_logits=False
        )

    def num_sms(self) -> int:
        return int(self.module.get_num_sms())

    def mk_alignment(self) -> int:
        """Row alignment of each expert's segment in the contiguous grouped layout."""
        return int(self.module.get_mk_alignment_for_contiguous_layout())

    def grouped_contiguous(self, a, a_scale, b, b_scale, out, m_indices) -> None:  # noqa: ANN001
        """``out[r] = a[r] @ b[m_indices[r]].T`` (rows with index ``-1`` skipped); FP8 with fp32 block scales."""
        m = self.module
        fn = getattr(m, "m_grouped_fp8_gemm_nt_contiguous", None) or m.m_grouped_fp8_fp4_gemm_nt_contiguous
        fn((a, a_scale), (b, b_scale), out, m_indices)

    def grouped_masked(self, a, a_scale, b, b_scale, out, masked_m, expected_m: int) -> None:  # noqa: ANN001
        """``out[e, :masked_m[e]] = a[e, :masked_m[e]] @ b[e].T`` for every expert ``e``."""
        m = self.module
        fn = getattr(m, "m_grouped_fp8_gemm_nt_masked", None) or m.m_grouped_fp8_fp4_gemm_nt_masked
        fn((a, a_scale), (b, b_scale), out, masked_m, expected_m)


def detect_generation(module: ModuleType) -> str:
    """``"fp8_fp4"`` when the module has the renamed indexer calls, ``"fp8"`` when only the first names exist."""
    if hasattr(module, "fp8_fp4_mqa_logits") and hasattr(module, "fp8_fp4_paged_mqa_logits"):
        return "fp8_fp4"
    if hasattr(module, "fp8_mqa_logits") and hasattr(module, "fp8_paged_mqa_logits"):
        return "fp8"
    raise ImportError(
        f"deep_gemm {getattr(module, '__version__', '?')} has neither fp8_fp4_mqa_logits nor fp8_mqa_logits "
        "(indexer kernels arrived in DeepGEMM 2.1, 2025-09)"
    )


def share_cxx_runtime() -> None:
    """Put the process's ``libstdc++`` in the global symbol scope before ``deep_gemm``'s extension loads.

    ``deep_gemm/_C.so`` also defines libstdc++'s locale symbols (``std::collate<char>::id``,
    ``std::locale::classic``), and the libstdc++ that torch pulled in is only in torch's local scope, so the
    extension binds to its own copies: its ``std::regex`` (the JIT's include parser) then looks up a facet with
    an id the process's locale never registered and jumps through a wrong vtable slot. On the lent H100 and H200
    (torch 2.11 cu130, g++ 13) every JIT call died that way with SIGSEGV inside ``collate<char>::transform``;
    preloading libstdc++ made the same calls pass (2026-11-23). Re-opening the already loaded library with
    ``RTLD_GLOBAL`` promotes it to the global scope, which is what the preload did. A missing library is no
    error (then nothing was loaded that could clash)."""
    import contextlib
    import ctypes

    with contextlib.suppress(OSError):
        ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)


@functools.lru_cache(maxsize=1)
def load_api() -> DeepGEMMAPI:
    """Import ``deep_gemm`` (once) and detect its generation; ImportError with the reason if unusable."""
    share_cxx_runtime()
    module = importlib.import_module("deep_gemm")
    return DeepGEMMAPI(module, detect_generation(module))
