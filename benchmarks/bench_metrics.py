"""/metrics: our hand-written exposition (serve/http/metrics.py) against the same metrics through prometheus-client.

Issue 17 asked for prometheus-client unless it measured slower; it does (see benchmarks/metrics.json), so the
server keeps its own. The prometheus-client version below is the one that was written and measured (same names,
labels, buckets, per-server registry). Times what a request costs (`record_request` with 64 inter-token gaps)
and what a scrape costs (`render`), averaged over many calls, and prints prometheus/ours ratios.

    pip install prometheus-client && python benchmarks/bench_metrics.py
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# No `*_created` series beside every counter and histogram: sglang and vLLM expose none, dashboards ignore them.
prometheus_client.disable_created_metrics()

LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
)  # fmt: skip

# Engine gauges: metrics() key -> (exposed name, help).
ENGINE_GAUGES = {
    "num_running": ("glm5:num_running_reqs", "Requests the engine is decoding."),
    "num_waiting": ("glm5:num_queue_reqs", "Requests waiting in the engine's queue."),
    "kv_cache_usage": ("glm5:token_usage", "Fraction of KV-cache blocks in use."),
    "num_free_blocks": ("glm5:kv_free_blocks", "Free KV-cache blocks."),
    "num_total_blocks": ("glm5:kv_total_blocks", "KV-cache blocks in all."),
    "prefix_cache_hit_rate": ("glm5:cache_hit_rate", "Share of prompt tokens found in the prefix cache."),
    "spec_accept_rate": ("glm5:spec_accept_rate", "Share of speculative draft tokens accepted."),
    "spec_accept_length": ("glm5:spec_accept_length", "Mean tokens emitted per speculative verification step."),
}

# Engine counters (cumulative): metrics() key -> (exposed name without `_total`, help).
ENGINE_COUNTERS = {
    "num_preemptions": ("glm5:num_preemptions", "Requests preempted (KV cache full) and recomputed."),
    "spec_draft_tokens": ("glm5:spec_draft_tokens", "Speculative draft tokens proposed."),
    "spec_accepted_tokens": ("glm5:spec_accepted_tokens", "Speculative draft tokens accepted."),
}


class _EngineCollector:
    """Yields the engine's gauges and counters from the snapshot `ServerMetrics.render` hands it."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        self.snapshot: dict = {}

    def collect(self):
        m = dict(self.snapshot)
        drafted = m.get("spec_draft_tokens")
        if drafted and "spec_accept_rate" not in m:
            m["spec_accept_rate"] = m.get("spec_accepted_tokens", 0) / drafted
        for key, (name, help_text) in ENGINE_GAUGES.items():
            if m.get(key) is not None:
                g = GaugeMetricFamily(name, help_text, labels=["model_name"])
                g.add_metric([self.model_name], float(m[key]))
                yield g
        for key, (name, help_text) in ENGINE_COUNTERS.items():
            if m.get(key) is not None:
                c = CounterMetricFamily(name, help_text, labels=["model_name"])
                c.add_metric([self.model_name], float(m[key]))
                yield c


class ServerMetrics:
    def __init__(self, model_name: str):
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=False)
        labels, reg = ["model_name"], self.registry

        def hist(name: str, help_text: str):
            return Histogram(name, help_text, labels, registry=reg, buckets=LATENCY_BUCKETS).labels(model_name)

        self.ttft = hist("glm5:time_to_first_token_seconds", "Time from request arrival to its first token.")
        self.itl = hist("glm5:inter_token_latency_seconds", "Time between successive tokens of a request.")
        self.e2e = hist("glm5:e2e_request_latency_seconds", "Time from request arrival to its last token.")
        self._prompt = Counter("glm5:prompt_tokens", "Prompt tokens processed.", labels, registry=reg).labels(
            model_name
        )
        self._generated = Counter("glm5:generation_tokens", "Tokens generated.", labels, registry=reg).labels(
            model_name
        )
        self._finished = Counter(
            "glm5:request_success", "Finished requests by finish reason.", [*labels, "finished_reason"], registry=reg
        )
        self._rejected = Counter("glm5:requests_rejected", "Requests refused with 429.", labels, registry=reg)
        self._rejected = self._rejected.labels(model_name)
        self._rejected_n = 0
        self._in_flight = Gauge("glm5:requests_in_flight", "Requests admitted by the HTTP app.", labels, registry=reg)
        self._engine = _EngineCollector(model_name)
        reg.register(self._engine)
        self._lock = threading.Lock()  # one scrape at a time: the engine snapshot is shared

    @property
    def rejected(self) -> int:
        return self._rejected_n

    @rejected.setter
    def rejected(self, value: int) -> None:  # `metrics.rejected += 1` at the call sites
        self._rejected.inc(value - self._rejected_n)
        self._rejected_n = value

    def record_request(
        self, ttft: float | None, gaps: list[float], e2e: float, prompt: int, generated: int, finish_reason: str
    ) -> None:
        if ttft is not None:
            self.ttft.observe(ttft)
        for gap in gaps:
            self.itl.observe(gap)
        self.e2e.observe(e2e)
        self._prompt.inc(prompt)
        self._generated.inc(generated)
        self._finished.labels(self.model_name, finish_reason).inc()

    def render(self, engine_metrics: dict, in_flight: int) -> str:
        """The exposition text, with the engine's values as of now."""
        with self._lock:
            self._in_flight.labels(self.model_name).set(in_flight)
            self._engine.snapshot = dict(engine_metrics)
            return generate_latest(self.registry).decode()


def per_call(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def measure(cls) -> dict:
    m = cls("glm-5")
    gaps = [0.01 + i * 1e-4 for i in range(64)]
    record = per_call(lambda: m.record_request(0.05, gaps, 0.8, 512, 64, "stop"), 2000)
    engine = {"num_running": 3, "num_waiting": 1, "kv_cache_usage": 0.4, "num_free_blocks": 10, "num_total_blocks": 20}
    render = per_call(lambda: m.render(engine, 4), 500)
    return {"record_request_us": record * 1e6, "render_us": render * 1e6}


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from serve.http.metrics import ServerMetrics as Ours

    ours, prom = measure(Ours), measure(ServerMetrics)
    out = {
        "ours": {k: round(v, 1) for k, v in ours.items()},
        "prometheus_client": {k: round(v, 1) for k, v in prom.items()},
        "prometheus_over_ours": {k: round(prom[k] / ours[k], 2) for k in ours},
    }
    print(json.dumps(out, indent=1))
    Path(__file__).with_name("metrics.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
