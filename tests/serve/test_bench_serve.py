"""`glm5 bench serve` against our own server (real engine, tiny checkpoint): the load generator end to end."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from glm5cli.app import app
from serve.http.app import create_app
from serve.http.settings import ServerSettings
from tests.serve.server_thread import ServerThread


@pytest.fixture(scope="module")
def server(tiny_engine):
    engine, tok = tiny_engine
    with ServerThread(create_app(engine, tok, ServerSettings("tiny", api_key="k", max_in_flight=128))) as s:
        s.wait_healthy()
        yield s


def run(*args):
    result = CliRunner().invoke(app, ["bench", "serve", *args], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_random_dataset_with_concurrency_cap_as_json(server, tmp_path):
    out = tmp_path / "runs.jsonl"
    text = run(
        "--base-url",
        server.url,
        "--api-key",
        "k",
        "--num-prompts",
        "12",
        "--max-concurrency",
        "4",
        "--random-input-len",
        "32",
        "--random-output-len",
        "8",
        "--json",
        "--output-file",
        str(out),
    )
    s = json.loads(text)
    assert s["completed"] == 12 and s["failed"] == 0 and s["model"] == "tiny"
    assert s["total_output_tokens"] == 12 * 8  # ignore_eos: exactly the requested length, counted by the server
    assert s["total_input_tokens"] >= 12 * 32 * 0.5
    for key in (
        "mean_ttft_ms",
        "p99_ttft_ms",
        "median_itl_ms",
        "p95_itl_ms",
        "mean_tpot_ms",
        "p90_e2el_ms",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "concurrency",
    ):
        assert s[key] > 0, key
    assert s["concurrency"] <= 4.5  # never more than the cap in flight
    assert s["p99_e2el_ms"] >= s["median_e2el_ms"] >= s["mean_ttft_ms"] * 0.5
    assert json.loads(out.read_text().splitlines()[0])["completed"] == 12


def test_shared_prefix_chat_with_poisson_rate_as_table(server):
    text = run(
        "--base-url",
        server.url,
        "--api-key",
        "k",
        "--dataset",
        "shared-prefix",
        "--api",
        "chat",
        "--gsp-num-groups",
        "2",
        "--gsp-prompts-per-group",
        "3",
        "--gsp-system-prompt-len",
        "40",
        "--gsp-question-len",
        "8",
        "--gsp-output-len",
        "6",
        "--request-rate",
        "20",
    )
    assert "Serving benchmark: tiny" in text and "Successful requests" in text and "Time to first token p99" in text
    assert "Failed requests" in text


def test_unreachable_server_and_bad_key(server):
    result = CliRunner().invoke(app, ["bench", "serve", "--base-url", "http://127.0.0.1:9", "--num-prompts", "1"])
    assert result.exit_code == 1 and "cannot reach" in result.output
    result = CliRunner().invoke(
        app, ["bench", "serve", "--base-url", server.url, "--api-key", "wrong", "--num-prompts", "1"]
    )
    assert result.exit_code == 1 and "401" in result.output
