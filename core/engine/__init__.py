"""Engine interface types (INTERIM copy on the ``server`` branch, written from /work/plan/INTERFACES.md).

The engine branch owns this package; when it is merged its ``__init__`` replaces this file. Until then the
server and its scripted test engine use these definitions, which follow the shared interface field by field.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """Per-request sampling settings (INTERFACES.md). Validates itself; ValueError with one clear message."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class RequestMetrics:
    arrival: float
    scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    metrics: RequestMetrics | None = None


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    pages_used: int
    pages_total: int
    kv_usage: float


def _flag(help_text: str, flag: str | None = None, aliases: tuple[str, ...] = ()) -> dict:
    meta: dict = {"help": help_text, "aliases": aliases}
    if flag:
        meta["flag"] = flag
    return meta


@dataclass
class EngineConfig:
    """Engine settings; the one source of the engine's command-line flags (INTERFACES.md)."""

    model: str | None = field(default=None, metadata=_flag("checkpoint directory (default: the embedded tiny model)"))
    dtype: str = field(default="bfloat16", metadata=_flag("activation dtype"))
    device: str = field(default="auto", metadata=_flag("cpu, cuda, cuda:N or auto"))
    kv_cache_dtype: str = field(default="auto", metadata=_flag("KV cache layout: auto, bf16 or fp8_e4m3"))
    page_size: int | None = field(default=None, metadata=_flag("tokens per KV page"))
    max_total_tokens: int | None = field(default=None, metadata=_flag("KV cache capacity in tokens"))
    mem_fraction_static: float = field(default=0.85, metadata=_flag("fraction of device memory for weights + KV"))
    chunked_prefill_size: int = field(default=2048, metadata=_flag("token budget of one scheduler step"))
    max_running_requests: int = field(default=64, metadata=_flag("most requests decoded together"))
    max_model_len: int | None = field(default=None, metadata=_flag("context length limit"))
    seed: int = field(default=0, metadata=_flag("global random seed"))
    dsa_prefill_backend: str = field(default="auto", metadata=_flag("sparse-attention prefill backend"))
    dsa_decode_backend: str = field(default="auto", metadata=_flag("sparse-attention decode backend"))
    dsa_topk_backend: str = field(default="auto", metadata=_flag("top-k backend"))
