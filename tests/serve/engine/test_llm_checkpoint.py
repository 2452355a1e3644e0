"""LLM over a real checkpoint directory (safetensors + the shipped tokenizer): strings in, text out."""

from __future__ import annotations

import pytest
import torch

from model.tokenizer import save_tokenizer_files
from serve import LLM, SamplingParams
from tests.serve.engine.conftest import plain_greedy


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_model):
    d = tmp_path_factory.mktemp("ckpt")
    tiny_model.save_pretrained(d)
    save_tokenizer_files(d)
    return d


def test_string_prompts_and_text_from_a_checkpoint(checkpoint, tiny_model):
    llm = LLM(checkpoint, dtype="float32", num_kv_blocks=64, block_size=4)
    assert llm.tokenizer is not None
    prompt = "def fib(n):"
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    out = llm.generate([prompt], params)[0]
    ids = llm.tokenizer.encode(prompt)
    assert out.prompt_token_ids == ids
    assert out.token_ids == plain_greedy(tiny_model, ids, 10)[0]
    assert out.text == llm.tokenizer.decode(out.token_ids, skip_special_tokens=True)


def test_bf16_engine_runs_and_stays_close_to_fp32(checkpoint):
    llm = LLM(checkpoint, dtype="bfloat16", num_kv_blocks=64, block_size=4)
    assert llm.engine.runner.kv.latent_NPK[0].dtype == torch.bfloat16
    out = llm.generate(
        [[5, 6, 7, 8, 9] * 5], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2)
    )
    assert len(out[0].token_ids) == 6 and all(lp.logprob <= 0 for lp in out[0].logprobs)


def test_unknown_dtype_is_rejected(checkpoint):
    with pytest.raises(ValueError, match="dtype must be one of"):
        LLM(checkpoint, dtype="float8")


def test_stop_token_stays_in_ids_but_not_in_text_and_special_tokens_on_request(checkpoint):
    llm = LLM(checkpoint, dtype="float32", num_kv_blocks=64, block_size=4)
    tok = llm.tokenizer
    prompt = [8136, 8149, 40, 41, 42, 43]  # <|assistant|><think> and some text ids
    free = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))[0]
    stop_id = free.token_ids[3]
    first = free.token_ids.index(stop_id)
    out = llm.generate(
        prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, stop_token_ids=[stop_id])
    )[0]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop_id)
    assert out.token_ids == free.token_ids[: first + 1]
    assert out.text == tok.decode(free.token_ids[:first], skip_special_tokens=True)
    raw = llm.generate(
        prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, skip_special_tokens=False)
    )[0]
    assert raw.text == tok.decode(raw.token_ids, skip_special_tokens=False)


def test_a_model_the_fast_path_fused_still_saves_and_reloads(tmp_path):
    """Fusion re-points the model's linears to slices of shared tensors; checkpoints must not notice."""
    from model import GLM5ForCausalLM, preset

    model = GLM5ForCausalLM.from_config(preset("tiny"), seed=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    LLM(model, num_kv_blocks=16, block_size=4).generate([1, 2, 3], SamplingParams(max_tokens=2))
    model.save_pretrained(tmp_path)
    reloaded = GLM5ForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).state_dict()
    assert before.keys() == reloaded.keys()
    assert all(torch.equal(before[k], reloaded[k]) for k in before)
