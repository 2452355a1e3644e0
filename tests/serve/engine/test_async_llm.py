"""AsyncLLM: streaming through asyncio, concurrent requests, abort on early exit, errors to the caller."""

from __future__ import annotations

import asyncio

import pytest

from serve import LLM, AsyncLLM, SamplingParams
from tests.serve.engine.conftest import plain_greedy, random_prompts


def test_streams_match_plain_greedy_and_early_exit_aborts(tiny_model):
    prompts = random_prompts([6, 19], tiny_model.config.vocab_size, seed=2)
    engine = LLM(tiny_model, num_kv_blocks=32, block_size=4).engine
    alm = AsyncLLM(engine)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)

    async def full(p):
        seen = []
        async for out in alm.generate(p, params):
            seen.append(list(out.token_ids))
        return seen, out

    async def partial(p):
        async for out in alm.generate(p, SamplingParams(temperature=0, max_tokens=500, ignore_eos=True), "quit"):
            if len(out.token_ids) == 2:
                break  # the client went away

    async def main():
        return await asyncio.gather(full(prompts[0]), full(prompts[1]), partial(prompts[1]))

    try:
        (seen0, last0), (_, last1), _ = asyncio.run(main())
        assert [len(s) for s in seen0] == list(range(1, 7))  # one cumulative output per token
        assert last0.finish_reason == "length" and last0.token_ids == plain_greedy(tiny_model, prompts[0], 6)[0]
        assert last1.token_ids == plain_greedy(tiny_model, prompts[1], 6)[0]
        for _ in range(100):  # the abort is processed by the engine thread between steps
            if not engine.has_unfinished:
                break
            asyncio.run(asyncio.sleep(0.02))
        assert not engine.has_unfinished and engine.block_manager.num_free_blocks == 32
    finally:
        alm.shutdown()


def test_a_bad_request_raises_in_its_caller_only(tiny_model):
    alm = AsyncLLM(LLM(tiny_model, num_kv_blocks=8, block_size=4).engine)

    async def bad():
        async for _ in alm.generate([10**6], SamplingParams(max_tokens=2)):
            pass

    async def good():
        outs = [o async for o in alm.generate([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))]
        return outs[-1]

    try:
        with pytest.raises(ValueError, match="outside the vocabulary"):
            asyncio.run(bad())
        assert asyncio.run(good()).finish_reason == "length"
    finally:
        alm.shutdown()


def test_weights_are_swapped_between_steps(tiny_model):
    alm = AsyncLLM(LLM(tiny_model, num_kv_blocks=16, block_size=4).engine)
    name = "model.norm.weight"

    async def main():
        version = await alm.update_weights({name: tiny_model.get_parameter(name).detach().clone()})
        outs = [o async for o in alm.generate([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))]
        return version, outs[-1]

    try:
        version, last = asyncio.run(main())
        assert version == 1 and last.weights_version == 1
    finally:
        alm.shutdown()


def test_a_duplicate_request_id_is_refused_without_touching_the_running_request(tiny_model):
    alm = AsyncLLM(LLM(tiny_model, num_kv_blocks=32, block_size=4).engine)

    async def first():
        return [o async for o in alm.generate([1, 2, 3], SamplingParams(max_tokens=40, ignore_eos=True), "dup")][-1]

    async def second():
        async for _ in alm.generate([5], SamplingParams(max_tokens=2), "dup"):
            pass

    async def main():
        task = asyncio.create_task(first())
        await asyncio.sleep(0)  # the first call has registered its stream
        with pytest.raises(ValueError, match="is already running"):
            await second()
        return await asyncio.wait_for(task, 30)

    try:
        last = asyncio.run(main())
        assert last.finish_reason == "length" and len(last.token_ids) == 40
    finally:
        alm.shutdown()
