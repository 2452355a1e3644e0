"""Prometheus metrics in the text exposition format (version 0.0.4), written here rather than via a dependency:
prometheus-client measured 3x slower per request and 10x per scrape (benchmarks/bench_metrics.py).

Latencies are measured by the app, per request, from arrival: time to first token, every inter-token gap, and end
to end. Engine gauges (running / waiting requests, KV-cache usage, prefix-cache hit rate, speculative acceptance)
are read from `engine.metrics()` at scrape time. Names follow sglang's (`sglang:` becomes `glm5:`).
"""

from __future__ import annotations

import threading
from collections import Counter

LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
)


def escape_label(value: str) -> str:
    """A label value as the exposition format writes it: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Histogram:
    def __init__(self, name: str, help_text: str, buckets=LATENCY_BUCKETS):
        self.name, self.help, self.buckets = name, help_text, tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
                break

    def render(self, labels: str) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        running = 0
        for bound, n in zip(self.buckets, self.counts, strict=True):
            running += n
            lines.append(f'{self.name}_bucket{{{labels},le="{bound:g}"}} {running}')
        lines.append(f'{self.name}_bucket{{{labels},le="+Inf"}} {self.count}')
        lines.append(f"{self.name}_sum{{{labels}}} {self.sum:.6f}")
        lines.append(f"{self.name}_count{{{labels}}} {self.count}")
        return lines


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


# Engine counters (cumulative): metrics() key -> (exposed name, help).
ENGINE_COUNTERS = {
    "num_preemptions": ("glm5:num_preemptions_total", "Requests preempted (KV cache full) and recomputed."),
    "spec_draft_tokens": ("glm5:spec_draft_tokens_total", "Speculative draft tokens proposed."),
    "spec_accepted_tokens": ("glm5:spec_accepted_tokens_total", "Speculative draft tokens accepted."),
}


class ServerMetrics:
    def __init__(self, model_name: str):
        self.model_name = model_name
        self.ttft = Histogram("glm5:time_to_first_token_seconds", "Time from request arrival to its first token.")
        self.itl = Histogram("glm5:inter_token_latency_seconds", "Time between successive tokens of a request.")
        self.e2e = Histogram("glm5:e2e_request_latency_seconds", "Time from request arrival to its last token.")
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: Counter[str] = Counter()
        self.rejected = 0
        self._lock = threading.Lock()

    def record_request(
        self, ttft: float | None, gaps: list[float], e2e: float, prompt: int, generated: int, finish_reason: str
    ) -> None:
        with self._lock:
            if ttft is not None:
                self.ttft.observe(ttft)
            for gap in gaps:
                self.itl.observe(gap)
            self.e2e.observe(e2e)
            self.prompt_tokens += prompt
            self.generation_tokens += generated
            self.finished[finish_reason] += 1

    def render(self, engine_metrics: dict, in_flight: int) -> str:
        labels = f'model_name="{escape_label(self.model_name)}"'
        lines: list[str] = []

        def scalar(name: str, kind: str, help_text: str, value: float, extra: str = "") -> None:
            if not any(line.startswith(f"# TYPE {name} ") for line in lines):
                lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
            lines.append(f"{name}{{{labels}{extra}}} {value:g}")

        with self._lock:
            scalar("glm5:prompt_tokens_total", "counter", "Prompt tokens processed.", self.prompt_tokens)
            scalar("glm5:generation_tokens_total", "counter", "Tokens generated.", self.generation_tokens)
            for reason, n in sorted(self.finished.items()):
                scalar(
                    "glm5:request_success_total",
                    "counter",
                    "Finished requests by finish reason.",
                    n,
                    f',finished_reason="{reason}"',
                )
            scalar("glm5:requests_rejected_total", "counter", "Requests refused with 429.", self.rejected)
            scalar("glm5:requests_in_flight", "gauge", "Requests admitted by the HTTP app.", in_flight)
            engine_metrics = dict(engine_metrics)
            drafted = engine_metrics.get("spec_draft_tokens")
            if drafted and "spec_accept_rate" not in engine_metrics:
                engine_metrics["spec_accept_rate"] = engine_metrics.get("spec_accepted_tokens", 0) / drafted
            for key, (name, help_text) in ENGINE_GAUGES.items():
                if engine_metrics.get(key) is not None:
                    scalar(name, "gauge", help_text, float(engine_metrics[key]))
            for key, (name, help_text) in ENGINE_COUNTERS.items():
                if engine_metrics.get(key) is not None:
                    scalar(name, "counter", help_text, float(engine_metrics[key]))
            for hist in (self.ttft, self.itl, self.e2e):
                lines.extend(hist.render(labels))
        return "\n".join(lines) + "\n"
