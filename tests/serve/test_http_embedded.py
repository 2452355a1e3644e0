"""The HTTP app over the real embedded engine and a tiny random-weight checkpoint, driven by the `openai` client.

Greedy decoding is deterministic, so the tests compare routes and modes against each other: streamed vs whole,
batched vs alone, /v1/completions vs /generate, and a stop string cut from the model's own greedy output.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from serve.http.app import create_app
from serve.http.settings import ServerSettings
from tests.serve.conftest import ask
from tests.serve.server_thread import ServerThread

MODEL = "tiny"


@pytest.fixture(scope="module")
def server(tiny_engine):
    engine, tok = tiny_engine
    with ServerThread(create_app(engine, tok, ServerSettings(MODEL, max_in_flight=128))) as s:
        s.wait_healthy()
        s.engine, s.tok = engine, tok
        yield s


def greedy_chat(client, text, **kw):
    return client.chat.completions.create(model=MODEL, messages=ask(text), temperature=0, **kw)


def streamed_text(stream) -> tuple[str, str, str | None]:
    reasoning, content, finish = "", "", None
    for c in stream:
        if not c.choices:
            continue
        d = c.choices[0].delta
        reasoning += d.model_extra.get("reasoning_content") or ""
        content += d.content or ""
        finish = c.choices[0].finish_reason or finish
    return reasoning, content, finish


def test_chat_stream_equals_whole_and_usage(client, server):
    whole = greedy_chat(client, "hello there", max_tokens=16)
    msg = whole.choices[0].message
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 16
    reasoning, content, finish = streamed_text(greedy_chat(client, "hello there", max_tokens=16, stream=True))
    assert (reasoning or None, content or None, finish) == (
        msg.model_extra.get("reasoning_content"),
        msg.content,
        "length",
    )
    prompt_ids = server.tok.encode(server.tok.decode(server.tok.encode("x")))  # the tokenizer round-trips
    assert prompt_ids == server.tok.encode("x")
    assert whole.usage.prompt_tokens > 0 and whole.usage.total_tokens == whole.usage.prompt_tokens + 16


def test_logprobs_of_greedy_tokens_are_the_top_ones(client):
    r = greedy_chat(client, "count with me", max_tokens=8, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == 8
    for e in content:
        assert len(e.top_logprobs) == 3 and e.logprob <= 0
        assert e.top_logprobs[0].logprob == pytest.approx(e.logprob, abs=1e-5)  # greedy picks the argmax
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob


def test_stop_string_taken_from_the_greedy_output(client):
    full = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=24, temperature=0)
    text = full.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), f"pick a visible stop string from {text!r}"
    cut = client.completions.create(
        model=MODEL, prompt="The quick brown fox", max_tokens=24, temperature=0, stop=[stop]
    )
    assert cut.choices[0].text == text[: text.index(stop)] and cut.choices[0].finish_reason == "stop"
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL, prompt="The quick brown fox", max_tokens=24, temperature=0, stop=[stop], stream=True
        )
        if c.choices
    )
    assert streamed == cut.choices[0].text


def test_seeded_sampling_reproduces_and_n_choices_differ(client):
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=1.0, n=3, seed=1234)
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert len({c.text for c in a.choices}) > 1  # seeds seed + i give different samples


def test_completions_ids_match_generate(client, server):
    ids = server.tok.encode("def fib(n):")
    r = httpx.post(
        server.url + "/generate",
        json={"input_ids": ids, "return_logprob": True, "sampling_params": {"max_new_tokens": 10, "temperature": 0}},
    )
    body = r.json()
    assert r.status_code == 200 and len(body["output_ids"]) == body["meta_info"]["completion_tokens"]
    assert body["meta_info"]["weight_version"] == "0" and body["meta_info"]["prompt_tokens"] == len(ids)
    assert [t for _, t in body["meta_info"]["output_token_logprobs"]] == body["output_ids"]
    cmpl = client.completions.create(model=MODEL, prompt=ids, max_tokens=10, temperature=0, logprobs=0)
    eos = set(server.tok.eos_token_ids)
    assert cmpl.choices[0].text == server.tok.decode([t for t in body["output_ids"] if t not in eos])
    assert cmpl.choices[0].logprobs.token_logprobs == pytest.approx(
        [lp for lp, _ in body["meta_info"]["output_token_logprobs"]], abs=1e-5
    )


def test_async_clients_batched_equal_alone(server, client):
    prompts = [f"question number {i}" for i in range(6)]
    alone = [greedy_chat(client, p, max_tokens=12).choices[0].message for p in prompts]

    async def main():
        c = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        try:
            return await asyncio.gather(
                *(
                    c.chat.completions.create(model=MODEL, messages=ask(p), temperature=0, max_tokens=12)
                    for p in prompts
                )
            )
        finally:
            await c.close()

    together = [r.choices[0].message for r in asyncio.run(main())]
    assert [(m.content, m.model_extra.get("reasoning_content")) for m in together] == [
        (m.content, m.model_extra.get("reasoning_content")) for m in alone
    ]


def test_prefix_cache_and_metrics(client, server):
    long_system = " ".join(["context"] * 80)
    for _ in range(2):
        client.chat.completions.create(
            model=MODEL,
            temperature=0,
            max_tokens=2,
            messages=[{"role": "system", "content": long_system}, {"role": "user", "content": "hi"}],
        )
    m = server.engine.metrics()
    assert m["prefix_cache_hit_rate"] > 0 and m["num_running"] == 0
    text = httpx.get(server.url + "/metrics").text
    hit = next(line for line in text.splitlines() if line.startswith("glm5:cache_hit_rate"))
    assert float(hit.rsplit(" ", 1)[1]) > 0
    ttft = next(line for line in text.splitlines() if line.startswith("glm5:time_to_first_token_seconds_count"))
    assert int(ttft.rsplit(" ", 1)[1]) >= 2
    for name in (
        "glm5:num_running_reqs",
        "glm5:num_queue_reqs",
        "glm5:token_usage",
        "glm5:kv_free_blocks",
        "glm5:inter_token_latency_seconds_bucket",
        "glm5:e2e_request_latency_seconds_sum",
    ):
        assert name in text


def test_context_limit_is_the_engines(client):
    with pytest.raises(openai.BadRequestError, match="context length is 512"):
        client.completions.create(model=MODEL, prompt=[5] * 600, max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=600)


def test_models_routes_and_max_completion_tokens(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL] and models[0].model_extra["max_model_len"] == 512
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    r = greedy_chat(client, "x", max_completion_tokens=5)
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"


def test_completions_batch_and_echo(client, server):
    ids = server.tok.encode("Once upon")
    r = client.completions.create(
        model=MODEL, prompt=[ids, server.tok.encode("Twice")], n=2, max_tokens=3, echo=True, temperature=0
    )
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text.startswith("Once upon") and r.choices[2].text.startswith("Twice")
    assert r.choices[0].text == r.choices[1].text  # greedy: both samples of a prompt agree
    assert r.usage.prompt_tokens == len(ids) + len(server.tok.encode("Twice"))


def test_tools_and_logprobs_through_the_real_engine(client):
    """A random model writes no tool call, but the path (template with tools, parser, streaming) must hold."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            },
        }
    ]
    r = greedy_chat(client, "list the files", tools=tools, max_tokens=12, logprobs=True)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert len(r.choices[0].logprobs.content) == r.usage.completion_tokens
    chunks = list(
        greedy_chat(
            client, "list the files", tools=tools, max_tokens=12, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_stop_token_ids_end_the_completion(client, server):
    prompt = server.tok.encode("The quick brown fox")
    out = httpx.post(
        server.url + "/generate",
        json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 12, "temperature": 0}},
    ).json()["output_ids"]
    stop_id = out[4]
    cut = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=12, temperature=0, extra_body={"stop_token_ids": [stop_id]}
    )
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].model_extra["stop_reason"] == stop_id
    assert cut.usage.completion_tokens == out.index(stop_id) + 1


def test_each_token_is_decoded_once_by_the_app_not_again_by_the_engine(client, server, monkeypatch):
    """The engine keeps no text for the app's requests (SamplingParams.detokenize=False): its detokenizer is
    never built, while the client still gets the text the app decoded."""
    import serve.engine.engine as engine_module

    built = []
    real = engine_module.Detokenizer
    monkeypatch.setattr(engine_module, "Detokenizer", lambda *a, **k: built.append(1) or real(*a, **k))
    r = greedy_chat(client, "hello there", max_tokens=8)
    assert built == [] and r.usage.completion_tokens == 8
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}}
    out = httpx.post(server.url + "/generate", json=body).json()
    assert built == [] and out["text"] == server.tok.decode(out["output_ids"])


def test_chat_returns_the_sampled_and_the_prompt_token_ids(client, server):
    """`return_token_ids` (vLLM / sglang): the ids a trainer trains on, the same streamed and whole."""
    kw = {"max_tokens": 12, "logprobs": True, "extra_body": {"return_token_ids": True}}
    whole = greedy_chat(client, "count to three", **kw)
    ids = whole.choices[0].model_extra["token_ids"]
    prompt_ids = whole.model_extra["prompt_token_ids"]
    assert len(ids) == whole.usage.completion_tokens == 12
    assert len(prompt_ids) == whole.usage.prompt_tokens
    assert len(whole.choices[0].logprobs.content) == 12
    streamed, streamed_prompt = [], None
    for c in greedy_chat(client, "count to three", stream=True, **kw):
        for ch in c.choices:
            streamed += ch.model_extra.get("token_ids") or []
            streamed_prompt = ch.model_extra.get("prompt_token_ids") or streamed_prompt
    assert streamed == ids and streamed_prompt == prompt_ids
    plain = greedy_chat(client, "count to three", max_tokens=12)
    assert "token_ids" not in (plain.choices[0].model_extra or {}) and "prompt_token_ids" not in plain.model_extra


def test_reusing_a_running_requests_rid_is_refused_and_the_running_request_finishes(server):
    body = {"input_ids": [1, 2, 3], "rid": "job-1", "sampling_params": {"max_new_tokens": 150, "ignore_eos": True}}

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            first = asyncio.create_task(c.post("/generate", json=body))
            for _ in range(500):  # until the engine runs it
                if "job-1" in server.engine.core.requests:
                    break
                await asyncio.sleep(0.01)
            dup = await c.post("/generate", json={**body, "input_ids": [5], "sampling_params": {"max_new_tokens": 2}})
            return dup, await first

    dup, first = asyncio.run(main())
    assert dup.status_code == 400 and "is already running" in dup.json()["error"]["message"]
    assert first.status_code == 200
    assert first.json()["meta_info"]["completion_tokens"] == 150
    assert first.json()["meta_info"]["finish_reason"] == {"type": "length"}


def test_a_tiny_temperature_decodes_greedily_with_finite_logprobs(client, server):
    body = {"input_ids": [5, 6, 7], "return_logprob": True, "top_logprobs_num": 2}
    sp = {"max_new_tokens": 6, "ignore_eos": True}
    greedy = httpx.post(server.url + "/generate", json={**body, "sampling_params": {**sp, "temperature": 0}})
    tiny = httpx.post(server.url + "/generate", json={**body, "sampling_params": {**sp, "temperature": 1e-300}})
    assert tiny.status_code == 200 and tiny.json()["output_ids"] == greedy.json()["output_ids"]
    assert tiny.json()["meta_info"]["output_token_logprobs"] == greedy.json()["meta_info"]["output_token_logprobs"]
    r = client.chat.completions.create(
        model=MODEL, messages=ask("hi"), temperature=1e-300, max_tokens=4, logprobs=True, stream=True
    )
    assert all(
        e.logprob > -1e4 for c in r if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content
    )


def test_a_non_finite_logprob_is_sent_as_openais_floor_not_as_invalid_json(server):
    from serve.engine.sequence import TokenLogprob
    from serve.http.logprobs import chat_logprobs, completion_logprobs

    entries = [TokenLogprob(5, float("nan"), {5: float("nan"), 6: float("-inf")})]
    chat = chat_logprobs(server.tok, entries, 2)["content"][0]
    assert chat["logprob"] == -9999.0 and [t["logprob"] for t in chat["top_logprobs"]] == [-9999.0, -9999.0]
    legacy = completion_logprobs(server.tok, entries, 2)
    assert legacy["token_logprobs"] == [-9999.0] and set(legacy["top_logprobs"][0].values()) == {-9999.0}
