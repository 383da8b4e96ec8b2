"""Prometheus metrics of one server (``GET /metrics``), named ``dsa:`` like vLLM's ``vllm:`` set.

Each server owns its own ``CollectorRegistry`` (two servers in one test process do not share counters).
Gauges of the engine's state (running, waiting, KV pages) are read from ``AsyncEngine.stats()`` at scrape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
                    20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


class ServerMetrics:
    """The server's metric families; ``model_name`` is the label every family carries."""

    def __init__(self, model_name: str, stats: Callable[[], Any]) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

        disable_created_metrics()  # the *_created series only double the scrape size

        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, doc, labels, registry=r, buckets=buckets).labels(model_name)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=r).labels(model_name)

        def gauge(name: str, doc: str, read: Callable[[Any], float]) -> None:
            g = Gauge(name, doc, labels, registry=r).labels(model_name)
            g.set_function(lambda: _read(stats, read))

        self.ttft = hist("dsa:time_to_first_token_seconds", "Request arrival to first token.", _LATENCY_BUCKETS)
        self.itl = hist("dsa:inter_token_latency_seconds", "Time between output tokens.", _ITL_BUCKETS)
        self.e2e = hist("dsa:e2e_request_latency_seconds", "Request arrival to finish.", _LATENCY_BUCKETS)
        self.queue = hist("dsa:request_queue_time_seconds", "Engine arrival to first scheduling.", _LATENCY_BUCKETS)
        self.prompt_tokens = counter("dsa:prompt_tokens_total", "Prompt tokens of finished and aborted requests.")
        self.generation_tokens = counter("dsa:generation_tokens_total", "Generated tokens.")
        self.aborted = counter("dsa:num_aborted_requests_total", "Requests aborted (client gone, shutdown).")
        self.tool_call_parse_errors = counter(
            "dsa:tool_call_parse_errors_total", "Tool calls whose arguments were not a valid JSON object."
        )
        self._success = Counter(
            "dsa:request_success_total", "Finished requests by finish reason.", ["model_name", "finished_reason"],
            registry=r,
        )
        self._model_name = model_name
        gauge("dsa:num_requests_running", "Requests in the running batch.", lambda s: s.num_running)
        gauge("dsa:num_requests_waiting", "Requests waiting to be scheduled.", lambda s: s.num_waiting)
        gauge("dsa:kv_cache_usage_perc", "Fraction of KV cache pages in use (0..1).", lambda s: s.kv_usage)
        gauge("dsa:kv_cache_pages_used", "KV cache pages in use.", lambda s: s.pages_used)
        gauge("dsa:kv_cache_pages_total", "KV cache pages in the pool.", lambda s: s.pages_total)
        gauge("dsa:engine_steps_total", "Engine steps run (their rate is the engine's step rate).",
              lambda s: s.steps_total)
        gauge("dsa:kv_cache_pages_cached", "Prefix-cache pages no request uses (evicted when pages run short).",
              lambda s: s.pages_cached)
        gauge("dsa:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
              lambda s: s.prefix_cache_queries_total)
        gauge("dsa:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
              lambda s: s.prefix_cache_hits_total)
        gauge("dsa:prefix_cache_hit_rate", "Prefix-cache hits over lookups, in tokens (0..1).",
              lambda s: s.prefix_cache_hits_total / s.prefix_cache_queries_total if s.prefix_cache_queries_total else 0.0)
        # MTP speculative decoding (zero without --speculative-algorithm); SGLang reports the accept length.
        gauge("dsa:spec_verify_total", "Speculative verifies (of a request with at least one draft token).",
              lambda s: s.spec_verifies_total)
        gauge("dsa:spec_draft_tokens_total", "Draft tokens verified.", lambda s: s.spec_draft_tokens_total)
        gauge("dsa:spec_accepted_tokens_total", "Draft tokens accepted.", lambda s: s.spec_accepted_tokens_total)
        gauge("dsa:spec_accept_length", "Mean tokens per speculative verify (accepted drafts + 1).",
              lambda s: s.spec_accept_length)
        # Expert parallelism (--ep-size; 0 / no series without it).
        gauge("dsa:ep_load_imbalance", "Max / mean token rows per EP rank per step, over the last second or so.",
              lambda s: s.ep_load_imbalance)
        r.register(_EPRankTokens(model_name, stats))

    def finished(self, reason: str) -> None:
        self._success.labels(self._model_name, reason).inc()

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _EPRankTokens:
    """``dsa:ep_rank_tokens_total{ep_rank="i"}``: one series per EP rank, as many as the engine reports."""

    def __init__(self, model_name: str, stats: Callable[[], Any]) -> None:
        self.model_name, self.stats = model_name, stats

    def describe(self) -> list[Any]:
        return [self._family()]

    def _family(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        return GaugeMetricFamily("dsa:ep_rank_tokens_total", "Token rows each EP rank's experts received.",
                                 labels=["model_name", "ep_rank"])

    def collect(self) -> Any:
        family = self._family()
        snapshot = self.stats()
        for rank, rows in enumerate(snapshot.ep_rank_tokens_total if snapshot is not None else ()):
            family.add_metric([self.model_name, str(rank)], rows)
        yield family


def _read(stats: Callable[[], Any], read: Callable[[Any], float]) -> float:
    snapshot = stats()
    if snapshot is None:
        return 0.0
    return float(read(snapshot))
