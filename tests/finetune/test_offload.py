"""finetune/offload.py: AdamW with its state in host memory trains exactly as the in-memory AdamW, and resumes."""

from __future__ import annotations

import copy

import torch

from finetune.offload import HostAdamW
from finetune.train_loop import LossTerms, OptimConfig, make_optimizer, train

CFG = OptimConfig(steps=6, lr=1e-2, warmup=2, weight_decay=0.1)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(5, 8, generator=g), torch.randn(5, 4, generator=g)) for _ in range(CFG.steps)]


def _loss(model):
    def loss_of(batch) -> LossTerms:
        x, y = batch
        loss = torch.nn.functional.mse_loss(model(x), y)
        return LossTerms(loss, loss.item(), [], x.shape[0])

    return loss_of


def _run(offload: bool, resume=None, save=None, save_every=0):
    model = _model()
    named = list(model.named_parameters())
    params = [p for _, p in named]
    opt = HostAdamW(params, CFG) if offload else make_optimizer(params, CFG)
    hist = train(model, named, _batches(), _loss(model), CFG, resume=resume, save=save, save_every=save_every,
                 opt=opt)  # fmt: skip
    return [h.lm for h in hist], model, opt


def test_offloaded_adamw_gives_the_same_losses_and_weights_as_adamw_in_memory():
    ref, ref_model, _ = _run(False)
    got, model, opt = _run(True)
    assert got == ref  # the same update, in the same order (both fused on CPU)
    for a, b in zip(model.parameters(), ref_model.parameters(), strict=True):
        assert torch.equal(a, b)
    n = sum(p.numel() for p in model.parameters())
    assert opt.host_bytes() == 12 * n  # fp32 master + AdamW's two fp32 moments per trained parameter
    for p, m in zip(opt.params, opt.masters, strict=True):
        assert m.data_ptr() != p.data_ptr()  # its own copy: the state does not live in the parameters' memory
    assert all(t.device.type == "cpu" for s in opt.state.values() for t in s.values() if torch.is_tensor(t))


def test_a_run_resumed_from_its_checkpoint_ends_where_an_uninterrupted_one_does():
    ref, _, _ = _run(True)
    saved = []  # as written to disk: a copy (the optimizer's state_dict holds its live tensors)
    _run(True, save=lambda state: saved.append(copy.deepcopy(state)), save_every=3)
    first = saved[0]
    assert first["step"] == 3
    got, _, _ = _run(True, resume=first)
    assert got == ref
