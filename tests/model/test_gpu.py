"""On a CUDA device: the same model in bf16 gives the CPU fp32 logits (within bf16 error), prefill and decode."""

from __future__ import annotations

import pytest
import torch

from model import GLM5ForCausalLM, KVCache
from tests.model.conftest import randomize, tiny


@pytest.mark.gpu
def test_cuda_bf16_matches_cpu_fp32():
    cpu = randomize(GLM5ForCausalLM(tiny())).eval()
    gpu = randomize(GLM5ForCausalLM(tiny())).eval().to("cuda", torch.bfloat16)
    gpu.tie_experts()
    ids = torch.randint(0, 8000, (2, 40))
    with torch.no_grad():
        ref = cpu(ids)
        got = gpu(ids.cuda()).float().cpu()
        assert (got - ref).norm() < 0.05 * ref.norm()
        cache = KVCache.for_config(gpu.config)
        gpu(ids[:, :-1].cuda(), cache=cache)
        step = gpu(ids[:, -1:].cuda(), cache=cache).float().cpu()
        assert (step[:, 0] - ref[:, -1]).norm() < 0.05 * ref[:, -1].norm()
