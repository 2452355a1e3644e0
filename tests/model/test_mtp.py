"""The MTP layer against a direct transcription of its formula (transformers has no MTP to compare with)."""

from __future__ import annotations

import torch

from model import GLM5ForCausalLM
from model.kv_cache import KVCache
from tests.model.conftest import close, randomize, tiny


def _model():
    return randomize(GLM5ForCausalLM(tiny())).eval()


def test_mtp_step_is_the_formula():
    model = _model()
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (2, 20))
    with torch.no_grad():
        _, hidden = model(ids, return_hidden=True)
        logits, mtp_hidden = model.mtp_forward(hidden[:, :-1], ids[:, 1:])
        layer = model.model.layers[cfg.num_hidden_layers]  # stored right after the main layers
        e = layer.enorm(model.model.embed_tokens(ids[:, 1:]))
        z = layer.eh_proj(torch.cat([e, layer.hnorm(hidden[:, :-1])], dim=-1))  # [embedding, hidden]
        pos = torch.arange(19).expand(2, 19)
        cos, sin = model.model.rope(pos)
        z, _ = layer(z, cos, sin, torch.arange(19))
        h = layer.shared_head.norm(z)
        assert close(mtp_hidden, h, 1e-6)
        assert close(logits, model.lm_head(h), 1e-5)
    assert model.get_parameter(f"model.layers.{cfg.num_hidden_layers}.eh_proj.weight").shape == (64, 128)


def test_three_chained_steps_and_cached_drafting_agree():
    model = _model()
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (1, 12))
    with torch.no_grad():
        _, h = model(ids, return_hidden=True)
        # Full-sequence chain (as in training): step k predicts token t+2+k from step k-1's hidden.
        for k in range(3):
            n = 12 - 1 - k
            logits, h = model.mtp_forward(h[:, :n], ids[:, 1 + k :], torch.arange(1 + k, 12), step=k)
            assert logits.shape == (1, n, cfg.vocab_size)
        # Same first step, token by token with a cache, gives the same draft logits.
        cache = KVCache.for_config(cfg)
        _, hid = model(ids, return_hidden=True)
        full, _ = model.mtp_forward(hid[:, :-1], ids[:, 1:])
        for t in range(11):
            step, _ = model.mtp_forward(hid[:, t : t + 1], ids[:, t + 1 : t + 2], torch.tensor([t + 1]), cache=cache)
            assert close(step[:, 0], full[:, t], 1e-4)
