"""The benchmark schedule: warm-up, then requests at Poisson arrival times under an optional concurrency cap."""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass

import httpx

from serve.bench.client import RequestResult, api_url, send_request
from serve.bench.dataset import BenchRequest
from serve.bench.metrics import summarize


@dataclass(frozen=True)
class BenchConfig:
    base_url: str
    api: str = "completions"  # "completions" -> /v1/completions, "chat" -> /v1/chat/completions
    model: str | None = None  # None: the first id from /v1/models
    api_key: str | None = None
    request_rate: float = math.inf  # requests per second, Poisson arrivals; inf sends them all at once
    max_concurrency: int | None = None
    stream: bool = True
    ignore_eos: bool = True
    warmup_requests: int = 1
    seed: int = 0
    timeout_s: float = 600.0
    slos: tuple[tuple[str, float], ...] = ()  # goodput SLOs in ms: (("ttft", 500.0), ...)


class BenchError(RuntimeError):
    """The benchmark could not start (server unreachable, no model); the message says what was tried."""


async def discover_model(client: httpx.AsyncClient, base_url: str) -> str:
    url = api_url(base_url, "/models")
    try:
        r = await client.get(url)
    except httpx.HTTPError as e:
        raise BenchError(f"cannot reach {url}: {e}") from e
    if r.status_code != 200:
        raise BenchError(f"GET {url} answered {r.status_code}: {r.text[:200]}")
    models = r.json().get("data") or []
    if not models:
        raise BenchError(f"GET {url} lists no models; pass --model")
    return models[0]["id"]


def arrival_gaps(n: int, rate: float, seed: int) -> list[float]:
    """Seconds to wait before each request: exponential gaps (a Poisson process) or none at rate inf."""
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    return [rng.expovariate(rate) for _ in range(n)]


async def run_benchmark(config: BenchConfig, requests: list[BenchRequest]) -> dict:
    """Run every request and return the summary (metrics.summarize) plus the settings that produced it."""
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(headers=headers, timeout=config.timeout_s, limits=limits) as client:
        model = config.model or await discover_model(client, config.base_url)
        for req in requests[: config.warmup_requests]:
            warm = await send_request(client, config.base_url, req, config.api, model, config.stream, config.ignore_eos)
            if not warm.success:
                raise BenchError(f"warm-up request failed: {warm.error}")
        limit = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else None

        async def one(req: BenchRequest) -> RequestResult:
            if limit is None:
                return await send_request(
                    client, config.base_url, req, config.api, model, config.stream, config.ignore_eos
                )
            async with limit:
                return await send_request(
                    client, config.base_url, req, config.api, model, config.stream, config.ignore_eos
                )

        start = time.perf_counter()
        tasks = []
        for req, gap in zip(requests, arrival_gaps(len(requests), config.request_rate, config.seed), strict=True):
            if gap:
                await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(one(req)))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    summary = summarize(list(results), duration, dict(config.slos))
    summary.update(
        {
            "base_url": config.base_url,
            "model": model,
            "api": config.api,
            "num_prompts": len(requests),
            "request_rate": "inf" if math.isinf(config.request_rate) else config.request_rate,
            "max_concurrency": config.max_concurrency,
        }
    )
    return summary
