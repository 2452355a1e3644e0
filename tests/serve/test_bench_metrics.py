"""Load-generator pieces without a server: datasets, arrival schedule, percentiles and the summary's definitions."""

from __future__ import annotations

import math
import statistics

from serve.bench.client import RequestResult, build_body
from serve.bench.dataset import random_dataset, shared_prefix_dataset
from serve.bench.metrics import percentile, summarize
from serve.bench.runner import arrival_gaps


def test_percentile_matches_linear_interpolation():
    data = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(data, 50) == 3.0
    assert math.isclose(percentile(data, 90), 4.0 + 0.6 * 6.0)
    assert percentile(data, 100) == 10.0 and percentile([], 99) == 0.0


def test_summary_definitions():
    a = RequestResult(True, ttft=0.1, latency=1.1, itl=[0.2] * 5, prompt_tokens=10, output_tokens=6)
    b = RequestResult(True, ttft=0.3, latency=0.3, itl=[], prompt_tokens=20, output_tokens=1)
    c = RequestResult(False, error="HTTP 500")
    s = summarize([a, b, c], duration_s=2.0)
    assert s["completed"] == 2 and s["failed"] == 1 and s["errors"] == ["HTTP 500"]
    assert s["total_input_tokens"] == 30 and s["total_output_tokens"] == 7
    assert s["request_throughput"] == 1.0 and s["output_throughput"] == 3.5 and s["total_token_throughput"] == 18.5
    assert math.isclose(s["mean_tpot_ms"], 200.0)  # (1.1 - 0.1) / (6 - 1); b has one token, so no TPOT
    assert math.isclose(s["mean_ttft_ms"], 200.0) and math.isclose(s["median_itl_ms"], 200.0)
    assert math.isclose(s["concurrency"], 0.7)  # (1.1 + 0.3) / 2 s


def test_poisson_gaps_have_the_requested_rate():
    gaps = arrival_gaps(4000, rate=20.0, seed=1)
    assert abs(statistics.fmean(gaps) - 0.05) < 0.005
    assert arrival_gaps(3, math.inf, 0) == [0.0, 0.0, 0.0]


def test_datasets_lengths_and_sharing():
    reqs = random_dataset(20, input_len=100, output_len=8, range_ratio=0.5, seed=3)
    assert all(50 <= r.prompt_len <= 100 and len(r.prompt.split()) == r.prompt_len for r in reqs)
    assert reqs == random_dataset(20, input_len=100, output_len=8, range_ratio=0.5, seed=3)  # seeded
    gsp = shared_prefix_dataset(num_groups=3, prompts_per_group=4, system_prompt_len=50, question_len=5)
    assert len(gsp) == 12 and len({r.system for r in gsp}) == 3 and len({r.prompt for r in gsp}) == 12
    chat = build_body(gsp[0], "chat", "m", stream=True, ignore_eos=True)
    assert chat["messages"][0] == {"role": "system", "content": gsp[0].system}
    assert chat["stream_options"] == {"include_usage": True} and chat["ignore_eos"] is True
    plain = build_body(gsp[0], "completions", "m", stream=False, ignore_eos=False)
    assert plain["prompt"].startswith(gsp[0].system) and "stream_options" not in plain and "ignore_eos" not in plain


def test_goodput_counts_requests_meeting_every_slo():
    import pytest

    from serve.bench.metrics import parse_slos

    fast = RequestResult(True, ttft=0.1, latency=0.5, prompt_tokens=1, output_tokens=5)  # tpot 100 ms
    slow = RequestResult(True, ttft=0.9, latency=1.0, prompt_tokens=1, output_tokens=5)
    slos = parse_slos("ttft:500 tpot:150")
    assert slos == {"ttft": 500.0, "tpot": 150.0}
    s = summarize([fast, slow], duration_s=2.0, slos=slos)
    assert s["request_goodput"] == 0.5 and s["slos_ms"] == slos
    assert "request_goodput" not in summarize([fast], 1.0)
    with pytest.raises(ValueError, match="one of ttft"):
        parse_slos("latency:3")
    with pytest.raises(ValueError, match="METRIC:MILLISECONDS"):
        parse_slos("ttft:fast")
