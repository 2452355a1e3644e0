"""A tiny random GLM-5 shared by the engine tests, and the plain-model references they compare against."""

from __future__ import annotations

import pytest
import torch

from model.config import preset
from model.modeling import GLM5ForCausalLM


@pytest.fixture(scope="package", autouse=True)
def one_thread():
    """The tiny model's ops are microseconds; a second intra-op thread only adds synchronisation, and on a
    shared 2-core CI machine waiting for it can cost 10x. Restored after this package."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model():
    # index_topk is 16 in the tiny preset, so prompts past 16 tokens take the sparse (top-k) path.
    model = GLM5ForCausalLM.from_config(preset("tiny"), seed=0).eval()
    assert model.config.index_topk == 16
    return model


@torch.inference_mode()
def plain_greedy(model, prompt: list[int], max_tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy decoding by full recompute: the whole sequence through the plain model at every step.
    Returns the tokens and the log_softmax of the logits each was taken from."""
    ids, out, logprobs = list(prompt), [], []
    for _ in range(max_tokens):
        logits = model(torch.tensor([ids]))[0, -1].float()
        top = logits.topk(2).values
        # Tests compare other computations' greedy tokens with these: a near tie (within ~100x fp32 reordering)
        # could pick the other token on another CPU or BLAS build, so a reference must not hold one.
        assert top[0] - top[1] > 1e-4 * logits.abs().max(), "near tie in a greedy reference: use another prompt"
        tok = int(logits.argmax())
        out.append(tok)
        logprobs.append(logits.log_softmax(-1))
        ids.append(tok)
    return out, logprobs


def random_prompts(lengths, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
