"""The server's contract beyond the routes: the body size limit (413), the access log, the port bound before the
model loads (`--port 0` names the real one), the KV cache sized to the model, OpenAI's 400s for conversations it
rejects, and `--base-url` with or without `/v1`."""

from __future__ import annotations

import json
import logging
import re
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
import torch

from model.config import preset
from model.tokenizer import Tokenizer
from serve.bench.client import api_url
from serve.http.app import create_app
from serve.http.server import bind, default_kv_cache_gib, run_embedded
from serve.http.settings import ServerSettings
from tests.serve.scripted_engine import ScriptedEngine
from tests.serve.server_thread import ServerThread

MODEL = "glm-5-test"
LIMIT = 4096


@pytest.fixture(scope="module")
def server():
    tok = Tokenizer.shipped()
    engine = ScriptedEngine(tok, "The answer is 42.", max_model_len=256)
    with ServerThread(create_app(engine, tok, ServerSettings(MODEL, max_body_bytes=LIMIT))) as s:
        s.wait_healthy()
        yield s


def chat_body(messages) -> dict:
    return {"model": MODEL, "messages": messages, "max_tokens": 4}


def test_a_body_over_the_limit_is_413_with_or_without_content_length(server):
    big = chat_body([{"role": "user", "content": "x" * (2 * LIMIT)}])
    r = httpx.post(server.url + "/v1/chat/completions", json=big)
    assert r.status_code == 413 and "--max-body-mb" in r.json()["error"]["message"]

    def chunks():  # no Content-Length: the limit is enforced while reading
        data = httpx.Request("POST", "/", json=big).content
        for i in range(0, len(data), 1000):
            yield data[i : i + 1000]

    r = httpx.post(server.url + "/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    ok = httpx.post(server.url + "/v1/chat/completions", json=chat_body([{"role": "user", "content": "hi"}]))
    assert ok.status_code == 200  # under the limit, and the server is fine


def test_one_access_log_line_per_request_streamed_or_not(server, caplog):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    with caplog.at_level(logging.INFO, logger="glm5.access"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True))
        httpx.get(server.url + "/v1/models/nope")
        time.sleep(0.2)
    lines = [r.getMessage() for r in caplog.records if r.name == "glm5.access"]
    assert len(lines) == 3, lines
    assert re.search(r'"POST /v1/chat/completions" 200 \d+B [\d.]+ms', lines[0])
    assert '"GET /v1/models/nope" 404' in lines[2]


def test_a_client_cannot_write_escape_codes_or_lines_into_the_log(server, caplog):
    # the path is percent-decoded: %1b]2;...%07 would set the operator's terminal title, %0a forge a line
    with caplog.at_level(logging.INFO, logger="glm5.access"):
        httpx.get(server.url + "/v1/%1b%5d2%3bPWNED%07%0a127.0.0.1:1%20%22GET%20/%22%20200%e2%80%ae")
        time.sleep(0.2)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "glm5.access"]
    assert "\x1b" not in line and "\n" not in line and "\u202e" not in line and "\x07" not in line
    assert r"/v1/\x1b]2;PWNED\x07\n127.0.0.1:1" in line and r"\u202e" in line and '" 404 ' in line


def test_the_servers_log_and_console_escape_what_clients_wrote():
    import io

    from serve.http.logs import SafeConsole, SafeFormatter

    fmt = SafeFormatter("%(levelname)s %(message)s")
    try:
        raise ValueError("bad model \x1b[8mhidden")
    except ValueError:
        rec = logging.LogRecord("glm5.serve", logging.ERROR, __file__, 1, "model %r: %s", ("m\x1b]0;t\x07", "a\nb"),
                                sys.exc_info())  # fmt: skip
    out = fmt.format(rec)
    assert "\x1b" not in out and "\x07" not in out
    assert out.startswith(r"ERROR model 'm\x1b]0;t\x07': a\nb" + "\n")  # one line, then the traceback's own lines
    assert r"ValueError: bad model \x1b[8mhidden" in out and "Traceback (most recent call last):\n" in out
    buf = io.StringIO()
    SafeConsole(file=buf, force_terminal=False).print("template: a\x1b]2;x\x07b\tc\nd", highlight=False)
    assert re.fullmatch(r"template: a\\x1b\]2;x\\x07b +c\nd\n", buf.getvalue())  # its own tab and newline kept


def test_no_access_log_when_turned_off(caplog):
    tok = Tokenizer.shipped()
    app = create_app(ScriptedEngine(tok, "hi"), tok, ServerSettings(MODEL, access_log=False, warmup=False))
    with ServerThread(app) as s, caplog.at_level(logging.INFO, logger="glm5.access"):
        assert httpx.get(s.url + "/v1/models").status_code == 200
    assert not [r for r in caplog.records if r.name == "glm5.access"]


@pytest.mark.parametrize(
    "messages, param, words",
    [
        ([{"role": "user"}], "messages[0].content", "Missing required parameter"),
        ([{"role": "user", "content": None}], "messages[0].content", "got null"),
        ([{"role": "user", "content": "hi"}, {"role": "tool", "content": "42"}], "messages[1].role", "tool_calls"),
        (
            [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "1"},
                {"role": "user", "content": "and?"},
                {"role": "tool", "tool_call_id": "c1", "content": "2"},  # answers a call of an earlier turn
            ],
            "messages[4].role",
            "tool_calls",
        ),
        (
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c9", "content": "1"},
            ],
            "messages[2].tool_call_id",
            "c9",
        ),
    ],
)
def test_conversations_openai_rejects_are_400(server, messages, param, words):
    r = httpx.post(server.url + "/v1/chat/completions", json=chat_body(messages))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"]


def test_tool_results_answering_calls_are_accepted(server):
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "2"}]},
    ]
    assert httpx.post(server.url + "/v1/chat/completions", json=chat_body(messages)).status_code == 200


def test_port_in_use_is_reported_before_the_model_loads(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # The checkpoint does not exist: had the server loaded it first, this would be a different error.
        with pytest.raises(SystemExit, match=rf"cannot listen on 127\.0\.0\.1:{port}.*--port"):
            run_embedded(tmp_path / "missing", "127.0.0.1", port, None, None, None, False, None, 8, None)
    sock = bind("127.0.0.1", 0)
    try:
        assert sock.getsockname()[1] != 0
    finally:
        sock.close()


def test_kv_cache_default_is_sized_to_the_model():
    tiny = preset("tiny")
    gib = default_kv_cache_gib(tiny, torch.float32, 16, None)
    from serve.engine.kv_cache import KVCache

    assert gib * 2**30 == pytest.approx(
        16 * tiny.max_position_embeddings * KVCache.bytes_per_token(tiny, torch.float32)
    )
    assert gib < 0.1  # tens of MB for a 5 MB model, not the 1 GiB every server used to allocate
    assert default_kv_cache_gib(preset("glm5"), torch.bfloat16, 16, None) == 1.0  # capped for a big one


def test_glm5_serve_port_0_prints_the_real_port_logs_requests_and_stays_small(tiny_checkpoint):
    cmd = [sys.executable, "-m", "glm5cli.app", "serve", str(tiny_checkpoint), "--port", "0", "--max-num-seqs", "2"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        url, seen = None, []
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line, "glm5 serve exited:\n" + "".join(seen)
            seen.append(line)
            m = re.search(r"ready\s+http://127\.0\.0\.1:(\d+)/v1", line)
            url = f"http://127.0.0.1:{m.group(1)}" if m else None
        assert url is not None and not url.endswith(":0")
        assert httpx.get(url + "/health").status_code == 200
        status = open(f"/proc/{proc.pid}/status").read()
        rss_mib = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024
        assert rss_mib < 1024, f"{rss_mib:.0f} MiB resident for a 5 MB model"  # 1.5 GiB with the old 1 GiB KV cache
        assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == tiny_checkpoint.name
        line = ""
        while "/v1/models" not in line:
            line = proc.stderr.readline()
        assert '"GET /v1/models" 200' in line
    finally:
        proc.terminate()
        proc.wait(30)


def test_base_url_with_or_without_v1():
    for base in ("http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/"):
        assert api_url(base, "/models") == "http://h:1/v1/models"


def test_a_loopback_server_refuses_other_sites_pages_and_rebound_names():
    # no key (the default): a page on another site could POST `text/plain` to 127.0.0.1 without a preflight and
    # load weights, or reach the port through a DNS name of its own that resolves to 127.0.0.1
    from serve.http.server import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")
    tok = Tokenizer.shipped()
    app = create_app(ScriptedEngine(tok, "hi"), tok, ServerSettings(MODEL, warmup=False, loopback_only=True))
    with ServerThread(app) as s:
        body = {"lora_name": "x", "lora_path": "/nonexistent"}
        evil = httpx.post(s.url + "/load_lora_adapter", content=json.dumps(body),
                          headers={"Origin": "https://evil.example", "Content-Type": "text/plain"})  # fmt: skip
        assert evil.status_code == 403 and "another site" in evil.json()["error"]["message"]
        rebound = httpx.get(s.url + "/v1/models", headers={"Host": "rebind.evil.example:80"})
        assert rebound.status_code == 403 and "rebind.evil.example" in rebound.json()["error"]["message"]
        assert httpx.get(s.url + "/v1/models", headers={"Origin": "null"}).status_code == 403
        assert httpx.get(s.url + "/v1/models").status_code == 200  # a client (openai, curl) sends no Origin
        assert httpx.get(s.url + "/v1/models", headers={"Origin": "http://localhost:3000"}).status_code == 200
        assert httpx.get(s.url + "/v1/models", headers={"Host": "[::1]:8000"}).status_code == 200
