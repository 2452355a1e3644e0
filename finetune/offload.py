"""AdamW with its state in host memory: the optimizer offload of `glm5 finetune plan --offload-optimizer`.

GPU memory then holds the trained parameters and their gradients only; AdamW's two fp32 moments (8 bytes per
trained parameter, the plan's "optimizer" row) and an fp32 master copy of each parameter live in host memory, pinned
where CUDA is there so the copies overlap (ZeRO-Offload's split: gradients down, updated parameters up, the update
itself on the CPU). With FSDP2 each rank keeps the state of its own shard (a DTensor's local tensor), so host
memory per rank is the plan's `host` figure.

A step: each gradient is copied to its master's `.grad`, torch's AdamW steps over the masters on the CPU (fused
where torch has the kernel), and the masters are copied back into the parameters. On a CPU-only machine the
masters are separate tensors on the same device and the update is the same arithmetic as `make_optimizer`'s
(tests/finetune/test_offload.py checks the losses are equal). `state_dict` / `load_state_dict` are AdamW's, so the
training loop's checkpoints and resume work unchanged; loading re-reads the masters from the parameters, which
`restore_training_state` has put back first.
"""

from __future__ import annotations

import torch


def _local(p: torch.Tensor) -> torch.Tensor:
    """The tensor this rank owns: a DTensor's local shard, else the tensor itself."""
    return p.to_local() if hasattr(p, "to_local") else p


class HostAdamW:
    """AdamW over fp32 host copies of `params` (see the module docstring). Quacks as the torch optimizer the
    training loop drives: param_groups (the loop sets lr there), zero_grad, step, state_dict, load_state_dict."""

    def __init__(self, params: list[torch.Tensor], cfg):
        """`cfg`: the run's train_loop.OptimConfig (lr, weight_decay)."""
        self.params = list(params)
        pin = torch.cuda.is_available()
        self.masters = []
        for p in self.params:
            m = _local(p).detach().to("cpu", dtype=torch.float32, copy=True)
            self.masters.append(m.pin_memory() if pin else m)
        fused = bool(self.masters) and all(m.is_contiguous() for m in self.masters)
        self.inner = torch.optim.AdamW(self.masters, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95),
                                       fused=fused or None)  # fmt: skip

    @property
    def param_groups(self) -> list[dict]:
        return self.inner.param_groups

    @property
    def state(self):
        return self.inner.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        for p, m in zip(self.params, self.masters, strict=True):
            g = p.grad
            m.grad = None if g is None else _local(g).to("cpu", dtype=torch.float32, non_blocking=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the gradients are on the host before the update reads them
        self.inner.step()
        for p, m in zip(self.params, self.masters, strict=True):
            if m.grad is not None:
                _local(p).copy_(m, non_blocking=True)
            m.grad = None

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)
        for p, m in zip(self.params, self.masters, strict=True):  # the parameters were restored first
            m.copy_(_local(p).detach().to("cpu", dtype=torch.float32))

    def host_bytes(self) -> int:
        """Bytes of host memory the offloaded state holds: the masters and AdamW's moments."""
        moments = sum(t.numel() * t.element_size() for s in self.inner.state.values() for t in s.values()
                      if torch.is_tensor(t) and t.dim())  # fmt: skip
        return moments + sum(m.numel() * m.element_size() for m in self.masters)
