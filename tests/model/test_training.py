"""The backward pass reaches every layer type: a tiny model overfits a fixed batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model import GLM5ForCausalLM
from tests.model.conftest import tiny


def test_fifty_adamw_steps_halve_the_loss():
    torch.manual_seed(0)
    cfg = tiny(index_topk_pattern="FSF")  # dense, MoE, full and shared indexer layers, and the MTP layer
    model = GLM5ForCausalLM.from_config(cfg, seed=0).train()
    ids = torch.randint(0, cfg.vocab_size, (2, 24))  # longer than index_topk: the sparse path trains too
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def loss_fn():
        logits, hidden = model(ids, return_hidden=True)
        lm = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        draft, _ = model.mtp_forward(hidden[:, :-2], ids[:, 1:-1])  # MTP drafts token t+2
        return lm + 0.3 * F.cross_entropy(draft.flatten(0, 1), ids[:, 2:].flatten())

    first = None
    for step in range(50):
        loss = loss_fn()
        opt.zero_grad()
        loss.backward()
        if step == 0:
            first = loss.item()
            no_grad = [n for n, p in model.named_parameters() if p.grad is None and "indexer" not in n]
            # Unused experts get no gradient on one batch; everything else must.
            assert all(".experts." in n for n in no_grad), no_grad[:5]
            assert model.get_parameter("model.layers.3.eh_proj.weight").grad is not None
        opt.step()
    assert loss.item() < first / 2, (first, loss.item())
