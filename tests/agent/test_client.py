"""The chat client: streamed deltas assembled, retries on 429/5xx/timeouts only, context-length errors typed."""

from __future__ import annotations

import json

import httpx
import pytest

from agent.client import APIError, ChatClient, ClientConfig, ContextLengthError
from tests.agent.fake_model import reply


def client(fake, **kw):
    c = ChatClient(ClientConfig(base_url=fake.base_url, model="m", **kw))
    c.sleep = lambda s: c.slept.append(s)
    c.slept = []
    return c


@pytest.mark.parametrize("stream", [True, False])
def test_stream_and_plain_give_the_same_response(fake_model, stream):
    r = reply("hello world, this is long", tools=[("bash", {"command": "ls -la"}), ("read", {"path": "a.py"})],
              reasoning="thinking about it")  # fmt: skip
    fake_model.script = [r]
    seen = []
    resp = client(fake_model, stream=stream).query(
        [{"role": "user", "content": "hi"}], on_delta=lambda k, t: seen.append(k)
    )
    assert resp.content == "hello world, this is long"
    assert resp.reasoning_content == "thinking about it"
    assert [tc["function"]["name"] for tc in resp.tool_calls] == ["bash", "read"]
    assert resp.tool_calls[0]["function"]["arguments"] == '{"command": "ls -la"}'
    assert resp.tool_calls[1]["id"] == "call_1"
    assert resp.usage["prompt_tokens"] == 100 and resp.finish_reason == "tool_calls"
    assert resp.message()["reasoning_content"] == "thinking about it"
    if stream:
        assert fake_model.requests[0]["stream"] is True and "reasoning" in seen and "tool_call" in seen
        assert resp.raw["choices"][0]["message"]["tool_calls"] == resp.tool_calls


def test_retries_429_and_5xx_with_backoff_then_succeeds(fake_model):
    fake_model.script = [{"status": 429}, {"status": 503}, reply("ok")]
    c = client(fake_model)
    assert c.query([{"role": "user", "content": "x"}]).content == "ok"
    assert len(fake_model.requests) == 3 and len(c.slept) == 2 and c.slept[1] > 0


def test_no_retry_on_4xx_and_gives_up_after_max_retries(fake_model):
    fake_model.script = [{"status": 401, "message": "bad key"}]
    c = client(fake_model)
    with pytest.raises(APIError, match="401"):
        c.query([{"role": "user", "content": "x"}])
    assert len(fake_model.requests) == 1 and c.slept == []

    fake_model.script = [{"status": 500}] * 3
    c = client(fake_model, max_retries=2)
    with pytest.raises(APIError, match="gave up after 2 retries"):
        c.query([{"role": "user", "content": "x"}])

    fake_model.script = [{"status": 400, "message": "This model's maximum context length is 8192 tokens"}]
    with pytest.raises(ContextLengthError):
        client(fake_model).query([{"role": "user", "content": "x"}])


def test_timeouts_and_connection_errors_are_retried():
    attempts = []

    def handler(request):
        attempts.append(1)
        if len(attempts) < 3:
            raise httpx.ReadTimeout("slow", request=request)
        return httpx.Response(200, json={"choices": [{"message": {"content": "late"}, "finish_reason": "stop"}]})

    c = ChatClient(ClientConfig(base_url="http://x/v1", stream=False), transport=httpx.MockTransport(handler))
    c.sleep = lambda s: None
    assert c.query([{"role": "user", "content": "x"}]).content == "late" and len(attempts) == 3


@pytest.mark.parametrize("stream", [True, False])
def test_provider_extra_body_brings_logprobs_and_token_ids_into_the_trajectory(repo, fake_model, stream):
    from agent.trajectory import Trajectory
    from tests.agent.helpers import make_session

    (repo / ".glm5").mkdir()
    (repo / ".glm5" / "settings.toml").write_text(
        f"[agent]\nstream = {str(stream).lower()}\n[providers.local]\nextra_body = {{ logprobs = true }}\n"
    )
    fake_model.script = [reply("fourteen chars")]
    s = make_session(repo, fake_model)
    s.agent.run("hi")
    s.close()
    assert fake_model.requests[0]["logprobs"] is True
    (sample,) = Trajectory.load(s.path).samples()
    assert sample["token_ids"] == [0, 1]
    assert [t["token"] for t in sample["logprobs"]["content"]] == ["fourtee", "n chars"]


def test_cancel_returns_at_once_even_before_the_first_byte(fake_model):
    import threading
    import time

    from agent.client import Cancelled

    fake_model.script = [lambda body: (time.sleep(2), reply("stale answer"))[1], reply("fresh answer")]
    c = client(fake_model)
    seen = []
    threading.Timer(0.2, c.cancel_event.set).start()
    t0 = time.monotonic()
    with pytest.raises(Cancelled):
        c.query([{"role": "user", "content": "slow"}], on_delta=lambda k, t: seen.append(t))
    assert time.monotonic() - t0 < 1.5
    c.cancel_event.clear()
    assert (
        c.query([{"role": "user", "content": "again"}], on_delta=lambda k, t: seen.append(t)).content == "fresh answer"
    )
    time.sleep(2.2)  # the abandoned call has finished by now: none of its text reached the callback
    assert "".join(seen) == "fresh answer"


def test_stream_quirks_of_other_servers():
    """vLLM's `reasoning` field, a name repeated in every tool delta, parsed-object arguments, no usage chunk."""
    import json as _json

    chunks = [
        {"choices": [{"delta": {"reasoning": "think "}}]},
        {"choices": [{"delta": {"reasoning": "more"}}]},
        {
            "choices": [
                {
                    "delta": {
                        "tool_calls": [{"index": 0, "id": "t1", "function": {"name": "bash", "arguments": '{"com'}}]
                    }
                }
            ]
        },  # fmt: skip
        {
            "choices": [
                {"delta": {"tool_calls": [{"index": 0, "function": {"name": "bash", "arguments": 'mand": "ls"}'}}]}}
            ]
        },  # fmt: skip
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
    ]
    sse = "".join(f"data: {_json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"

    def handler(request):
        if _json.loads(request.content).get("stream"):
            return httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})
        msg = {"role": "assistant", "content": None, "tool_calls": [{"id": "t2", "function": {"name": "read",
               "arguments": {"path": "a.py"}}}]}  # fmt: skip
        return httpx.Response(200, json={"choices": [{"message": msg, "finish_reason": "tool_calls"}]})

    c = ChatClient(ClientConfig(base_url="http://x/v1"), transport=httpx.MockTransport(handler))
    r = c.query([{"role": "user", "content": "x"}])
    assert r.reasoning_content == "think more" and r.usage == {}
    assert r.tool_calls == [
        {"id": "t1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    ]
    r = c.query([{"role": "user", "content": "x"}], stream=False)
    assert _json.loads(r.tool_calls[0]["function"]["arguments"]) == {"path": "a.py"}


@pytest.mark.parametrize("stream", [True, False])
def test_token_ids_and_logprobs_recorded_by_default_from_a_known_server(repo, fake_model, stream):
    from agent.trajectory import Trajectory
    from tests.agent.helpers import make_session

    (repo / ".glm5").mkdir()
    (repo / ".glm5" / "settings.toml").write_text(f"[agent]\nstream = {str(stream).lower()}\n")
    fake_model.owned_by = "vllm"
    fake_model.script = [reply(tools=[("glob", {"pattern": "*.py"})]), reply("fourteen chars")]
    s = make_session(repo, fake_model)
    s.agent.run("hi")
    s.close()
    assert all(r["logprobs"] is True and r["return_token_ids"] is True for r in fake_model.requests)
    samples = list(Trajectory.load(s.path).samples())
    assert len(samples) == 2
    last = samples[1]
    assert last["token_ids"] == [0, 1] and [t["token"] for t in last["logprobs"]["content"]] == ["fourtee", "n chars"]
    assert last["prompt_token_ids"] == list(range(100, 100 + len(fake_model.requests[1]["messages"])))


def test_unknown_servers_are_not_asked_for_token_fields(fake_model):
    fake_model.script = [reply("ok")]
    c = ChatClient(ClientConfig(base_url=fake_model.base_url, model="fake-glm"))
    c.query([{"role": "user", "content": "x"}])
    assert "logprobs" not in fake_model.requests[0] and "return_token_ids" not in fake_model.requests[0]
    fake_model.owned_by = "vllm"
    off = ChatClient(ClientConfig(base_url=fake_model.base_url, model="fake-glm", record_tokens=False))
    fake_model.script = [reply("ok")]
    off.query([{"role": "user", "content": "x"}])
    assert "return_token_ids" not in fake_model.requests[1]


def test_a_server_that_rejects_the_token_fields_is_asked_again_without_them(fake_model):
    fake_model.owned_by = "sglang"
    fake_model.script = [{"status": 400, "message": "unknown field: return_token_ids"}, reply("ok"), reply("again")]
    c = client(fake_model)
    c.config = ClientConfig(base_url=fake_model.base_url, model="fake-glm")
    assert c.query([{"role": "user", "content": "x"}]).content == "ok"
    assert c.query([{"role": "user", "content": "y"}]).content == "again"
    first, second, third = fake_model.requests
    assert first["return_token_ids"] is True and "return_token_ids" not in second and "logprobs" not in third


def test_refused_connection_to_localhost_fails_at_once_naming_the_url():
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    c = ChatClient(ClientConfig(base_url=f"http://127.0.0.1:{port}/v1", max_retries=4))
    c.sleep = lambda s: pytest.fail("a refused local connection must not be retried")
    with pytest.raises(APIError, match=rf"nothing is listening at http://127.0.0.1:{port}/v1/chat/completions"):
        c.query([{"role": "user", "content": "x"}])


def test_remote_connection_errors_name_the_url_when_giving_up():
    def handler(request):
        raise httpx.ConnectError("Connection refused", request=request)

    c = ChatClient(ClientConfig(base_url="http://gpu-box:8000/v1", max_retries=1, stream=False),
                   transport=httpx.MockTransport(handler))  # fmt: skip
    c.sleep = lambda s: None
    with pytest.raises(APIError, match=r"http://gpu-box:8000/v1/chat/completions: .*gave up after 1 retries"):
        c.query([{"role": "user", "content": "x"}])


def test_a_bare_server_address_means_its_v1_and_a_hosted_path_is_kept():
    from agent.client import api_root

    assert api_root("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert api_root("http://127.0.0.1:8000/") == "http://127.0.0.1:8000/v1"
    assert api_root("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/v1"
    assert api_root("https://api.z.ai/api/paas/v4") == "https://api.z.ai/api/paas/v4"
    seen = []

    def handler(request):
        seen.append(request.url.path)
        return httpx.Response(200, json={"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]})

    c = ChatClient(ClientConfig(base_url="http://x:8000", stream=False), transport=httpx.MockTransport(handler))
    c.query([{"role": "user", "content": "hi"}])
    assert seen[-1] == "/v1/chat/completions"


def test_a_seeded_client_sends_seed_plus_the_requests_index_and_a_retry_sends_the_same():
    bodies = []

    def handler(request):
        bodies.append(json.loads(request.content))
        if len(bodies) == 1:
            raise httpx.ReadTimeout("slow", request=request)
        return httpx.Response(200, json={"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]})

    c = ChatClient(ClientConfig(base_url="http://x/v1", stream=False, seed=41), transport=httpx.MockTransport(handler))
    c.sleep = lambda s: None
    c.query([{"role": "user", "content": "x"}])
    c.query([{"role": "user", "content": "y"}])
    assert [b["seed"] for b in bodies] == [41, 41, 42]  # the retried request is the same request
    plain = ChatClient(ClientConfig(base_url="http://x/v1", stream=False), transport=httpx.MockTransport(handler))
    plain.query([{"role": "user", "content": "z"}])
    assert "seed" not in bodies[-1]
