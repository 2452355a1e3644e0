"""Summary statistics of a benchmark run, with sglang `bench_serving` / vLLM `bench serve` definitions.

- TTFT: request start -> first generated text.     - ITL: every gap between successive text chunks.
- TPOT: (latency - TTFT) / (output tokens - 1), per request with more than one output token.
- E2E latency: request start -> last byte.          - Concurrency: sum of request latencies / wall time.
- Goodput: completed requests per second that met every SLO given (`--goodput ttft:500 tpot:50 e2el:2000`, ms).
Times are reported in milliseconds; throughputs per second of wall time (the benchmark's duration).
"""

from __future__ import annotations

import statistics

from serve.bench.client import RequestResult

PERCENTILES = (50, 90, 95, 99)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), so results match the Python tools people compare with."""
    if not values:
        return 0.0
    data = sorted(values)
    pos = (len(data) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def describe(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    out = {
        "mean": statistics.fmean(ms) if ms else 0.0,
        "median": statistics.median(ms) if ms else 0.0,
        "std": statistics.pstdev(ms) if len(ms) > 1 else 0.0,
        "max": max(ms) if ms else 0.0,
    }
    out.update({f"p{q}": percentile(ms, q) for q in PERCENTILES})
    return out


SLO_KEYS = ("ttft", "tpot", "e2el")


def parse_slos(spec: str | None) -> dict[str, float]:
    """`"ttft:500 tpot:50"` -> {"ttft": 500.0, "tpot": 50.0} (milliseconds), vLLM's `--goodput` syntax."""
    slos: dict[str, float] = {}
    for part in (spec or "").replace(",", " ").split():
        key, _, value = part.partition(":")
        if key not in SLO_KEYS:
            raise ValueError(f"--goodput {part!r}: the metric must be one of {', '.join(SLO_KEYS)}")
        try:
            slos[key] = float(value)
        except ValueError:
            raise ValueError(f"--goodput {part!r}: expected METRIC:MILLISECONDS") from None
    return slos


def _tpot(r: RequestResult) -> float:
    return (r.latency - r.ttft) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0


def meets(r: RequestResult, slos: dict[str, float]) -> bool:
    values = {"ttft": r.ttft, "tpot": _tpot(r), "e2el": r.latency}
    return all(values[k] * 1000 <= limit for k, limit in slos.items())


def summarize(results: list[RequestResult], duration_s: float, slos: dict[str, float] | None = None) -> dict:
    ok = [r for r in results if r.success]
    total_in = sum(r.prompt_tokens for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    tpots = [_tpot(r) for r in ok if r.output_tokens > 1]
    duration = max(duration_s, 1e-9)
    summary = {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration_s,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration,
        "input_throughput": total_in / duration,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
        "concurrency": sum(r.latency for r in ok) / duration,
        "errors": sorted({r.error for r in results if not r.success})[:10],
    }
    if slos:
        summary["slos_ms"] = dict(slos)
        summary["request_goodput"] = sum(meets(r, slos) for r in ok) / duration
    for name, values in (
        ("ttft", [r.ttft for r in ok]),
        ("itl", [gap for r in ok for gap in r.itl]),
        ("tpot", tpots),
        ("e2el", [r.latency for r in ok]),
    ):
        for stat, value in describe(values).items():
            summary[f"{stat}_{name}_ms"] = value
    return summary
