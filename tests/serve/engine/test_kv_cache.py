"""The paged cache holds exactly GLM-5's per-token entries; the sparse decode reads only top-k of them."""

from __future__ import annotations

import pytest
import torch

from model.config import memory_bytes, preset
from serve.engine.config import EngineConfig
from serve.engine.engine import LLMEngine
from serve.engine.kv_cache import KVCache
from serve.engine.sampling_params import SamplingParams
from tests.serve.engine.conftest import random_prompts


@pytest.mark.parametrize("name", ["tiny", "small", "glm5"])
def test_bytes_per_token_equal_model_info(name):
    cfg = preset(name)
    assert KVCache.bytes_per_token(cfg, torch.bfloat16) * 1024 == memory_bytes(cfg)["kv_cache_per_1k_tokens_bf16"]
    if name == "glm5":  # 78 layers x (512 + 64 + 128) values x 2 bytes
        assert KVCache.bytes_per_token(cfg, torch.bfloat16) == 78 * 704 * 2


def test_allocated_tensors_match_the_count():
    cfg = preset("tiny")
    kv = KVCache(cfg, num_blocks=10, block_size=4, dtype=torch.float32)
    assert kv.num_bytes == KVCache.bytes_per_token(cfg, torch.float32) * 10 * 4
    assert kv.c_kv_NPC[0].shape == (10, 4, cfg.kv_lora_rank)
    assert kv.k_pe_NPR[0].shape == (10, 4, cfg.qk_rope_head_dim)
    assert kv.index_k_NPD[0].shape == (10, 4, cfg.index_head_dim)


def test_kv_cache_gib_sizes_the_pool():
    cfg = preset("small")
    n = KVCache.num_blocks_for_memory(cfg, 16, torch.float32, 0.5)
    assert n * 16 * KVCache.bytes_per_token(cfg, torch.float32) <= 0.5 * 2**30
    assert (n + 1) * 16 * KVCache.bytes_per_token(cfg, torch.float32) > 0.5 * 2**30


def test_decode_reads_only_the_selected_latents(tiny_model):
    """With a 41-token context and index_topk 16, a decode step gathers 16 latents per layer, not 41;
    with a 9-token context (dense: all fit) it gathers all of them."""
    cfg = tiny_model.config
    engine = LLMEngine(tiny_model, config=EngineConfig(block_size=4, num_kv_blocks=64))
    for p in random_prompts([40, 8], cfg.vocab_size, seed=4):
        engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    engine.step()  # prefill (and the first token)
    engine.runner.decode_latents_read = 0
    engine.step()  # decode: contexts 41 and 9
    assert engine.runner.decode_latents_read == cfg.num_hidden_layers * (cfg.index_topk + 9)
