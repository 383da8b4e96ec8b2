"""``EngineConfig``: the one dataclass behind the engine's options, the CLI flags and the server's flags.

Every field's metadata carries its flag (``"flag"``), help text and optional ``"aliases"``/``"choices"``;
:mod:`dsa_runtime.engine.cli_args` turns the dataclass into argparse options and back, so a new option is
added in one place. The older SGLang spellings ``--nsa-*-backend`` are accepted as aliases of ``--dsa-*``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from dsa_runtime.errors import ConfigError

AUTO = "auto"
DTYPES = ("bfloat16", "float32")
_DTYPE_ALIASES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp32": "float32", "float32": "float32"}
KV_CACHE_DTYPES = ("auto", "bf16", "fp8_e4m3")
SPECULATIVE_ALGORITHMS = ("EAGLE", "NEXTN")
# --kv-cache-dtype value -> MLA cache layout of the kernel families (bf16 576 / FP8 656 bytes a token).
_KV_LAYOUT = {"auto": AUTO, "bf16": "bf16", "fp8_e4m3": "fp8_656"}


def _opt(flag: str, help: str, **extra: Any) -> dict[str, Any]:
    return {"flag": flag, "help": help, **extra}


@dataclass
class EngineConfig:
    """Options of one engine (model, memory, batching, kernels). Field docs are the CLI help texts."""

    model: str | None = field(
        default=None,
        metadata=_opt(
            "--model", "checkpoint directory (default: the embedded tiny V3.2 model, created on first use)"
        ),
    )
    dtype: str = field(
        default="bfloat16", metadata=_opt("--dtype", "activation and weight dtype", choices=DTYPES)
    )
    device: str = field(
        default=AUTO, metadata=_opt("--device", "torch device (default auto: the detected platform's)")
    )
    kv_cache_dtype: str = field(
        default=AUTO,
        metadata=_opt(
            "--kv-cache-dtype",
            "MLA cache format: bf16 (576 values/token), fp8_e4m3 (656 bytes/token), auto (platform default)",
            choices=KV_CACHE_DTYPES,
        ),
    )
    page_size: int | None = field(
        default=None, metadata=_opt("--page-size", "tokens per KV page (default: the platform's)")
    )
    max_total_tokens: int | None = field(
        default=None,
        metadata=_opt(
            "--max-total-tokens", "KV cache capacity in tokens (default: from --mem-fraction-static)"
        ),
    )
    mem_fraction_static: float = field(
        default=0.85,
        metadata=_opt(
            "--mem-fraction-static", "fraction of free device memory for weights, KV cache and workspaces"
        ),
    )
    chunked_prefill_size: int = field(
        default=2048,
        metadata=_opt("--chunked-prefill-size", "most tokens run in one step (prefill chunk budget)"),
    )
    max_running_requests: int = field(
        default=64, metadata=_opt("--max-running-requests", "most requests decoding at once")
    )
    max_model_len: int | None = field(
        default=None,
        metadata=_opt(
            "--max-model-len", "longest prompt + output (default: the model's, capped by the cache)"
        ),
    )
    cpu_threads: int | None = field(
        default=None,
        metadata=_opt(
            "--cpu-threads",
            "torch intra-op threads on a CPU device, process-wide (default: 1 for tiny models of hidden size "
            "<= 1024, whose ops are too small to split and run 10-50x slower with 2 threads on busy cores; "
            "else torch's choice)",
        ),
    )
    disable_cuda_graph: bool = field(
        default=False,
        metadata=_opt("--disable-cuda-graph", "run decode steps eagerly instead of replaying captured CUDA graphs"),
    )
    disable_overlap_schedule: bool = field(
        default=False,
        metadata=_opt("--disable-overlap-schedule", "finish each step's host work (detokenising, stop checks) before "
                      "launching the next decode step, instead of overlapping it with the GPU (CUDA only)"),
    )
    disable_radix_cache: bool = field(
        default=False,
        metadata=_opt("--disable-radix-cache", "recompute every prompt instead of reusing the KV pages of a cached "
                      "prefix (the radix-tree prefix cache)"),
    )
    cuda_graph_max_bs: int | None = field(
        default=None,
        metadata=_opt(
            "--cuda-graph-max-bs",
            "largest decode batch captured in a CUDA graph (default: --max-running-requests, at most 256); "
            "larger batches run eagerly",
        ),
    )
    cuda_graph_bs: list[int] | None = field(
        default=None,
        metadata=_opt(
            "--cuda-graph-bs",
            "decode batch sizes to capture (default: 1 2 4 8, then every 8 up to --cuda-graph-max-bs)",
            nargs="+",
        ),
    )
    seed: int = field(
        default=0, metadata=_opt("--seed", "seed of the random weights/unseeded sampling streams")
    )
    platform: str = field(
        default=AUTO,
        metadata=_opt("--platform", "platform plugin to run on (default auto: the detected one)"),
    )
    dsa_prefill_backend: str = field(
        default=AUTO,
        metadata=_opt(
            "--dsa-prefill-backend", "sparse-attention prefill backend", aliases=["--nsa-prefill-backend"]
        ),
    )
    dsa_decode_backend: str = field(
        default=AUTO,
        metadata=_opt(
            "--dsa-decode-backend", "sparse-attention decode backend", aliases=["--nsa-decode-backend"]
        ),
    )
    dsa_topk_backend: str = field(
        default=AUTO,
        metadata=_opt(
            "--dsa-topk-backend", "top-k (+ page-table transform) backend", aliases=["--nsa-topk-backend"]
        ),
    )
    tp: int = field(
        default=1, metadata=_opt("--tp", "tensor-parallel ranks (worker processes; gloo on CPU, NCCL on GPUs)",
                                 aliases=["--tp-size", "--tensor-parallel-size"]),
    )
    dp: int = field(
        default=1, metadata=_opt("--dp", "data-parallel attention groups (needs --enable-dp-attention)",
                                 aliases=["--dp-size"]),
    )
    enable_dp_attention: bool = field(
        default=False,
        metadata=_opt("--enable-dp-attention", "split the --tp ranks into --dp attention groups, each with its "
                      "own requests and KV cache; tokens of all groups meet in the FFN / MoE"),
    )
    ep_size: int = field(
        default=1,
        metadata=_opt("--ep-size", "expert-parallel ranks: each holds n_routed_experts / N whole experts and tokens "
                      "travel to their experts' ranks (all-to-all); must divide --tp and the routed expert count",
                      aliases=["--expert-parallel-size", "--ep"]),
    )
    moe_a2a_backend: str = field(
        default=AUTO,
        metadata=_opt("--moe-a2a-backend", "expert-parallel dispatch / combine backend (the moe_comm kernel family): "
                      "auto, reference, torch (CPU), nccl (fixed-capacity, CUDA-graph safe), deepep (needs DeepEP)"),
    )
    nnodes: int = field(default=1, metadata=_opt("--nnodes", "nodes of a multi-node --tp run"))
    node_rank: int = field(
        default=0, metadata=_opt("--node-rank", "this node's index (0 runs the scheduler; others only ranks)")
    )
    dist_init_addr: str | None = field(
        default=None, metadata=_opt("--dist-init-addr", "HOST:PORT of node 0's rendezvous (multi-node)")
    )
    dist_timeout: float = field(
        default=300.0,
        metadata=_opt("--dist-timeout", "seconds before a stuck collective is an error (a dead rank stops the service)"),
    )
    tp_reduce_dtype: str = field(
        default="fp32",
        metadata=_opt("--tp-reduce-dtype", "dtype of the row-parallel partial sums and their all-reduce under --tp: "
                      "fp32 (tp N equals tp 1 up to fp32 summation order; 2x all-reduce bytes) or bf16",
                      choices=("fp32", "bf16")),
    )
    distributed_executor_backend: str = field(
        default="uni",
        metadata=_opt("--distributed-executor-backend", "uni: the model in this process at --tp 1; mp: the "
                      "distributed runner (rank processes, steps sent as token rows) even at --tp 1, always above",
                      choices=("uni", "mp")),
    )
    json_model_override_args: str | None = field(
        default=None,
        metadata=_opt("--json-model-override-args", "a JSON object merged into the checkpoint's config.json, e.g. "
                      "'{\"index_topk_freq\": 4}' (IndexCache: 3 of 4 layers reuse the top-k of the layer before); "
                      "keys that would change the checkpoint's tensors are refused"),
    )
    speculative_algorithm: str | None = field(
        default=None,
        metadata=_opt("--speculative-algorithm", "speculative decoding: EAGLE (NEXTN is an alias) drafts tokens with "
                      "the checkpoint's MTP (NextN) layer and verifies them in one target forward "
                      "(default: off)", choices=SPECULATIVE_ALGORITHMS),
    )
    speculative_num_steps: int | None = field(
        default=None,
        metadata=_opt("--speculative-num-steps", "draft steps per verify (default 3 with --speculative-algorithm)"),
    )
    speculative_eagle_topk: int | None = field(
        default=None,
        metadata=_opt("--speculative-eagle-topk", "draft candidates per step (only 1, a chain, is supported; "
                      "default 1)"),
    )
    speculative_num_draft_tokens: int | None = field(
        default=None,
        metadata=_opt("--speculative-num-draft-tokens", "tokens per verify, the last accepted one included "
                      "(with top-k 1: --speculative-num-steps + 1, the default)"),
    )
    indexer_backend: str = field(
        default=AUTO, metadata=_opt("--indexer-backend", "lightning-indexer backend")
    )
    kv_quant_backend: str = field(default=AUTO, metadata=_opt("--kv-quant-backend", "KV-cache store backend"))
    moe_backend: str = field(default=AUTO, metadata=_opt("--moe-backend", "MoE routing + experts backend"))

    def __post_init__(self) -> None:
        dtype = _DTYPE_ALIASES.get(str(self.dtype).replace("torch.", ""))
        if dtype is None:
            raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        self.dtype = dtype
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}"
            )
        for name in (
            "page_size",
            "max_total_tokens",
            "max_model_len",
            "chunked_prefill_size",
            "max_running_requests",
            "cuda_graph_max_bs",
            "speculative_num_steps",
            "speculative_eagle_topk",
            "speculative_num_draft_tokens",
        ):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"{flag_of(name)} must be an integer >= 1, got {value!r}")
        if self.cuda_graph_bs is not None:
            sizes = list(self.cuda_graph_bs) if isinstance(self.cuda_graph_bs, (list, tuple)) else [self.cuda_graph_bs]
            if not sizes or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in sizes):
                raise ConfigError(f"--cuda-graph-bs must be integers >= 1, got {self.cuda_graph_bs!r}")
            self.cuda_graph_bs = sorted(set(sizes))
        self._check_speculative()
        self.model_overrides()  # a ConfigError now for anything but a JSON object
        try:
            self.parallel()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if not 0.0 < float(self.mem_fraction_static) <= 1.0:
            raise ConfigError(f"--mem-fraction-static must be in (0, 1], got {self.mem_fraction_static!r}")

    def _check_speculative(self) -> None:
        """Fill the speculative defaults (3 steps, top-k 1, steps + 1 draft tokens) and reject what is unsupported."""
        given = [flag_of(n) for n in ("speculative_num_steps", "speculative_eagle_topk",
                                      "speculative_num_draft_tokens") if getattr(self, n) is not None]
        if self.speculative_algorithm is None:
            if given:
                raise ConfigError(f"{given[0]} needs --speculative-algorithm EAGLE (or NEXTN)")
            return
        algo = str(self.speculative_algorithm).upper()
        if algo not in SPECULATIVE_ALGORITHMS:
            raise ConfigError(f"--speculative-algorithm must be one of {', '.join(SPECULATIVE_ALGORITHMS)}, "
                              f"got {self.speculative_algorithm!r}")
        self.speculative_algorithm = "EAGLE"  # NEXTN is SGLang's alias: the same MTP drafting
        if self.speculative_num_steps is None:
            self.speculative_num_steps = 3
        if self.speculative_eagle_topk is None:
            self.speculative_eagle_topk = 1
        if self.speculative_eagle_topk != 1:
            raise ConfigError(f"--speculative-eagle-topk {self.speculative_eagle_topk}: only 1 (chain drafting) is "
                              "supported; tree drafts are not implemented")
        if self.speculative_num_draft_tokens is None:
            self.speculative_num_draft_tokens = self.speculative_num_steps + 1
        if self.speculative_num_draft_tokens != self.speculative_num_steps + 1:
            raise ConfigError(f"--speculative-num-draft-tokens must be --speculative-num-steps + 1 "
                              f"({self.speculative_num_steps + 1}) with --speculative-eagle-topk 1, got "
                              f"{self.speculative_num_draft_tokens}")

    def model_overrides(self) -> dict[str, Any]:
        """``--json-model-override-args`` as a dict (empty when not given)."""
        from dsa_runtime.loader.overrides import parse_overrides

        return parse_overrides(self.json_model_override_args)

    def check_draft_model(self, model_config: Any, has_mtp: bool) -> None:
        """``ConfigError`` when speculation is asked for and the checkpoint has no MTP (NextN) layer."""
        if self.speculative and not (has_mtp and model_config.num_nextn_predict_layers):
            raise ConfigError("--speculative-algorithm needs the checkpoint's MTP (NextN) layer, and this one has "
                              f"none (num_nextn_predict_layers {model_config.num_nextn_predict_layers})")

    @property
    def speculative(self) -> bool:
        """Whether MTP speculative decoding is on."""
        return self.speculative_algorithm is not None

    def parallel(self) -> Any:
        """The :class:`~dsa_runtime.distributed.ParallelConfig` of ``--tp`` / ``--dp`` / the node flags."""
        from dsa_runtime.distributed.parallel import ParallelConfig

        return ParallelConfig(tp=self.tp, dp=self.dp, enable_dp_attention=self.enable_dp_attention,
                              nnodes=self.nnodes, node_rank=self.node_rank, dist_init_addr=self.dist_init_addr,
                              timeout_s=self.dist_timeout, reduce_dtype=self.tp_reduce_dtype, ep=self.ep_size)

    def graph_batch_sizes(self) -> list[int]:
        """The decode batch sizes to capture (empty with --disable-cuda-graph)."""
        if self.disable_cuda_graph:
            return []
        if self.cuda_graph_bs is not None:
            return list(self.cuda_graph_bs)
        from dsa_runtime.model.decode_graph import default_batch_sizes

        return default_batch_sizes(self.cuda_graph_max_bs or min(self.max_running_requests, 256))

    def graph_row_sizes(self) -> list[int]:
        """Row buckets of the target and draft decode graphs: the batch sizes, and with speculation up to
        ``speculative_num_steps + 1`` rows per request (a verify's rows; a draft extend's at most as many)."""
        sizes = self.graph_batch_sizes()
        if not sizes or not self.speculative:
            return sizes
        per = self.speculative_num_steps + 1
        if self.cuda_graph_bs is not None:
            return sorted(set(sizes) | {s * per for s in sizes})
        from dsa_runtime.model.decode_graph import default_batch_sizes

        return default_batch_sizes(max(sizes) * per)

    @property
    def kv_layout(self) -> str:
        """Kernel-facing MLA cache layout: ``auto``, ``bf16`` or ``fp8_656``."""
        return _KV_LAYOUT[self.kv_cache_dtype]

    def kernel_config(self) -> Any:
        """The :class:`~dsa_runtime.resolve.KernelConfig` these options ask for (sparse-attention prefill and
        decode resolved per method, as SGLang's ``--dsa-prefill-backend`` / ``--dsa-decode-backend``)."""
        from dsa_runtime.resolve import KernelConfig

        return KernelConfig(
            platform=self.platform,
            device=self.device,
            kv_layout=self.kv_layout,
            indexer=self.indexer_backend,
            topk=self.dsa_topk_backend,
            kv_quant=self.kv_quant_backend,
            moe=self.moe_backend,
            moe_comm=self.moe_a2a_backend,
            sparse_attn_prefill=self.dsa_prefill_backend,
            sparse_attn_decode=self.dsa_decode_backend,
        )


def flag_of(name: str) -> str:
    """The CLI flag of an :class:`EngineConfig` field."""
    for f in fields(EngineConfig):
        if f.name == name:
            return str(f.metadata.get("flag", "--" + name.replace("_", "-")))
    raise KeyError(name)
