"""The benchmark summary as a rich table (for people) and as JSON / a JSONL line (for scripts and CI)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

METRICS = (
    ("ttft", "Time to first token"),
    ("itl", "Inter-token latency"),
    ("tpot", "Time per output token"),
    ("e2el", "End-to-end latency"),
)


def summary_table(summary: dict) -> Table:
    table = Table(title=f"Serving benchmark: {summary.get('model')} @ {summary.get('base_url')}", show_lines=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("Successful requests", f"{summary['completed']}"),
        ("Failed requests", f"{summary['failed']}"),
        ("Request rate / max concurrency", f"{summary.get('request_rate')} / {summary.get('max_concurrency') or '-'}"),
        ("Benchmark duration (s)", f"{summary['duration_s']:.2f}"),
        ("Total input tokens", f"{summary['total_input_tokens']}"),
        ("Total output tokens", f"{summary['total_output_tokens']}"),
        ("Request throughput (req/s)", f"{summary['request_throughput']:.2f}"),
        ("Input token throughput (tok/s)", f"{summary['input_throughput']:.2f}"),
        ("Output token throughput (tok/s)", f"{summary['output_throughput']:.2f}"),
        ("Total token throughput (tok/s)", f"{summary['total_token_throughput']:.2f}"),
        ("Concurrency", f"{summary['concurrency']:.2f}"),
    ]
    if "request_goodput" in summary:
        slos = " ".join(f"{k}<={v:g}ms" for k, v in summary["slos_ms"].items())
        rows.append((f"Request goodput (req/s, {slos})", f"{summary['request_goodput']:.2f}"))
    for name, value in rows:
        table.add_row(name, value)
    for key, title in METRICS:
        table.add_section()
        for stat in ("mean", "median", "std", "p90", "p95", "p99", "max"):
            table.add_row(f"{title} {stat} (ms)", f"{summary[f'{stat}_{key}_ms']:.2f}")
    return table


def append_jsonl(summary: dict, path: Path) -> None:
    """Append one line per run, as sglang's --output-file does."""
    with path.open("a") as f:
        f.write(json.dumps(summary) + "\n")
