"""The chat client: streamed deltas assembled, retries on 429/5xx/timeouts only, context-length errors typed."""

from __future__ import annotations

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
