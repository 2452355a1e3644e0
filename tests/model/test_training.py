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


def test_inference_forward_equals_the_training_forward_bit_for_bit():
    """Without autograd, RMSNorm, the residual sums, the MoE's activation and its routed sum run in place
    (model/norms.py, decoder_layer.py, moe.py): the logits must be the very same numbers as with autograd, on
    both fast expert paths, and the training forward must still backpropagate."""
    torch.manual_seed(0)
    model = GLM5ForCausalLM.from_config(tiny(), seed=0)
    ids = torch.randint(0, model.config.vocab_size, (2, 40))
    for impl in ("stacked", "per_expert"):
        for layer in model.model.layers:
            if hasattr(layer.mlp, "experts"):  # frozen experts keep the stacked path under autograd
                layer.mlp.experts.requires_grad_(impl == "per_expert")
                if impl == "per_expert":  # experts that own their weights (the same values): no stacked path
                    for lin in (m for m in layer.mlp.experts.modules() if isinstance(m, torch.nn.Linear)):
                        lin.weight = torch.nn.Parameter(lin.weight.detach().clone())
                assert layer.mlp._stacked_ok() == (impl == "stacked")
        train = model(ids)
        with torch.inference_mode():
            infer = model(ids)
        with torch.no_grad():
            no_grad = model(ids)
        assert torch.equal(train.detach(), infer) and torch.equal(infer, no_grad), impl
        F.cross_entropy(train[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
        for name in ("model.layers.0.self_attn.q_a_proj.weight", "model.layers.1.mlp.shared_experts.up_proj.weight"):
            assert model.get_parameter(name).grad.abs().sum() > 0, name
        model.zero_grad()
