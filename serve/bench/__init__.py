"""`glm5 bench serve`: a load generator for any OpenAI-compatible server, with sglang `bench_serving` semantics.

Module map:
- dataset.py  the prompts: `random` (random words of a target length) and `shared-prefix` (groups of prompts that
              share a long system prompt, the agentic case: sglang's `generated-shared-prefix`).
- client.py   one streamed request (SSE read with httpx-sse): records time to first token, every inter-token
              gap, end-to-end latency and the server's token counts; `api_url` takes a base URL with or
              without `/v1`.
- runner.py   the schedule: Poisson arrivals at `--request-rate` (inf = all at once) under an optional
              `--max-concurrency` cap, warm-up requests first, model discovered from /v1/models.
- metrics.py  the summary: request / token throughput, concurrency, and mean / median / std / p90 / p95 / p99 of
              TTFT, ITL, TPOT and E2E latency in milliseconds (field names as vLLM's `bench serve` writes them).
- report.py   the summary as a rich table, or as JSON / a JSONL line.

Life of a run: dataset -> runner schedules client calls -> list of RequestResult -> metrics.summarize -> report.
"""
