"""NVIDIA detection shared by the Hopper and Blackwell platform plugins (NVML; nothing heavy imported)."""

from __future__ import annotations

from dsa_runtime.hw_probe import describe_gpus, module_available, probe_nvidia
from dsa_runtime.platform import Detection


def detect_arch(major: int, label: str, libraries: tuple[str, ...]) -> Detection:
    """Present when an NVIDIA GPU of compute capability ``major.x`` is visible; reports optional libraries."""
    probe = probe_nvidia()
    matching = tuple(g for g in probe.gpus if g.capability[0] == major)
    libs = {lib: "found" if module_available(lib) else "not installed" for lib in libraries}
    if matching:
        return Detection(True, f"{label} GPU: {describe_gpus(matching)}", device="cuda", details=libs)
    if probe.gpus:
        return Detection(False, f"no {label} GPU (found {describe_gpus(probe.gpus)})", details=libs)
    return Detection(False, probe.reason, details=libs)


NVIDIA_REASONS = {
    "page_size": "64: DeepGEMM's paged indexer and FlashMLA require it",
    "dense_prefill_threshold": "prompts of <= 2048 KV tokens attend densely (exactly equivalent)",
}
